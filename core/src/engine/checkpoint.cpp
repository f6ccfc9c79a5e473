// Checkpoint files and the byte form of saved states (see checkpoint.hpp).
#include "sluice/core/checkpoint.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "chunk_carrier.hpp"
#include "files/remote_access.hpp"
#include "sluice/core/lineage.hpp"
#include "sluice/core/atomic_file.hpp"
#include "sluice/rng.hpp"
#include "sluice/sample_codec.hpp"
#include "sluice/tensor.hpp"

namespace fs = std::filesystem;

namespace sluice {
namespace {

// The file: magic, the payload's length and checksum, the payload (a Checkpoint message). A
// protobuf message cut short often still parses: the length and checksum catch that.
constexpr char kMagic[8] = {'S', 'L', 'C', 'K', 'P', 'T', '0', '1'};
constexpr std::size_t kHeaderBytes = sizeof kMagic + 2 * sizeof(std::uint64_t);

std::uint64_t checksum(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then mixed: damage, not tampering
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return mix64(h);
}

void append(std::string& out, const void* data, std::size_t size) { out.append(static_cast<const char*>(data), size); }
void append_u64(std::string& out, std::uint64_t v) { append(out, &v, sizeof v); }

}  // namespace

fs::path checkpoint_file(const fs::path& dir_or_file) {
  std::error_code ec;
  if (fs::is_directory(dir_or_file, ec) || !dir_or_file.has_extension()) return dir_or_file / kCheckpointFileName;
  return dir_or_file;
}

void write_checkpoint(const fs::path& file, const checkpoint::Checkpoint& checkpoint) {
  std::error_code ec;
  if (file.has_parent_path() && !is_remote_uri(file.string())) fs::create_directories(file.parent_path(), ec);
  if (ec) throw Error(fmt::format("cannot create checkpoint directory {}: {}", file.parent_path().string(), ec.message()));
  std::string payload;
  if (!checkpoint.SerializeToString(&payload)) throw Error("could not encode the checkpoint for " + file.string());
  std::string content(kMagic, sizeof kMagic);
  append_u64(content, payload.size());
  append_u64(content, checksum(payload));
  content += payload;
  try {
    // A bucket's checkpoint is uploaded whole once written (remote/).
    write_file_atomically(file, content, is_remote_uri(file.string()) ? &host_storage() : nullptr);
  } catch (const std::exception& e) {
    throw Error(fmt::format("could not write checkpoint {}: {} (the previous checkpoint there, if any, is unchanged)", file.string(), e.what()));
  }
}

checkpoint::Checkpoint parse_checkpoint(const std::string& name, const std::string& content);

// A checkpoint in a bucket, read whole.
std::string read_remote_checkpoint(const std::string& uri) {
  try {
    auto reader = host_storage().open(uri);
    std::string content(static_cast<std::size_t>(reader->object().size), '\0');
    for (std::size_t got = 0; got < content.size();) {
      const std::size_t n = reader->read(reinterpret_cast<std::byte*>(content.data()) + got, content.size() - got);
      if (n == 0) throw Error("it ended early");
      got += n;
    }
    return content;
  } catch (const std::exception& e) {
    throw Error(fmt::format("cannot read checkpoint {}: {}", uri, e.what()));
  }
}

checkpoint::Checkpoint read_checkpoint(const fs::path& file) {
  std::error_code ec;
  if (is_remote_uri(file.string())) return parse_checkpoint(file.string(), read_remote_checkpoint(file.string()));
  if (!fs::exists(file, ec)) throw Error(fmt::format("no checkpoint at {} (give the directory --checkpoint wrote to, or its {})", file.string(), kCheckpointFileName));
  if (!fs::is_regular_file(file, ec)) throw Error(fmt::format("{} is not a regular file: give a checkpoint file or its directory", file.string()));
  std::ifstream in(file, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!in && !in.eof()) throw Error(fmt::format("cannot read checkpoint {}", file.string()));
  return parse_checkpoint(file.string(), buffer.str());
}

checkpoint::Checkpoint parse_checkpoint(const std::string& name, const std::string& content) {
  const fs::path file(name);
  if (content.size() < kHeaderBytes || std::memcmp(content.data(), kMagic, sizeof kMagic) != 0) {
    // Python's state_dict()["checkpoint"], written to a file: the same message without the header.
    checkpoint::Checkpoint state;
    if (state.ParseFromString(content) && state.format() == kCheckpointFormat && state.stages_identity_size() > 0) return state;
    throw Error(fmt::format("{} is not a Sluice checkpoint (it does not start with the checkpoint header, nor is it the bytes of a "
                            "Python state's \"checkpoint\")",
                            file.string()));
  }
  std::uint64_t size = 0, sum = 0;
  std::memcpy(&size, content.data() + sizeof kMagic, sizeof size);
  std::memcpy(&sum, content.data() + sizeof kMagic + sizeof size, sizeof sum);
  if (size != content.size() - kHeaderBytes)
    throw Error(fmt::format("checkpoint {} is damaged: it should hold {} bytes after its header, it holds {} (cut short or "
                            "appended to); resume from an earlier checkpoint",
                            file.string(), size, content.size() - kHeaderBytes));
  std::string_view payload(content.data() + kHeaderBytes, size);
  if (checksum(payload) != sum)
    throw Error(fmt::format("checkpoint {} is damaged: its checksum does not match its contents; resume from an earlier checkpoint", file.string()));
  checkpoint::Checkpoint checkpoint;
  if (!checkpoint.ParseFromArray(payload.data(), static_cast<int>(payload.size())))
    throw Error(fmt::format("checkpoint {} is damaged: its contents do not decode", file.string()));
  if (checkpoint.format() != kCheckpointFormat)
    throw Error(fmt::format("checkpoint {} has format {}; this Sluice reads format {} (made by another version)", file.string(),
                            checkpoint.format(), kCheckpointFormat));
  return checkpoint;
}

std::vector<FolderCheckpoint> checkpoints_in_folder(const fs::path& folder) {
  std::vector<std::string> names;
  if (is_remote_uri(folder.string())) {  // a folder in a bucket: the objects right under it
    std::string prefix = folder.string();
    if (prefix.back() != '/') prefix += '/';
    for (const auto& object : host_storage().list(prefix))
      if (object.uri.find('/', prefix.size()) == std::string::npos) names.push_back(object.uri.substr(prefix.size()));
  } else {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(folder, ec)) names.push_back(entry.path().filename().string());
  }
  std::vector<FolderCheckpoint> found;
  for (const std::string& name : names) {
    int index = -1, count = -1, used = 0;
    if (name == kCheckpointFileName)
      found.push_back({name, -1, 1});
    else if (std::sscanf(name.c_str(), "worker-%d-of-%d.sluice%n", &index, &count, &used) == 2 && used == static_cast<int>(name.size()) &&
             index >= 0 && index < count)
      found.push_back({name, index, count});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return std::tie(a.count, a.index) < std::tie(b.count, b.index); });
  return found;
}

std::string describe_checkpoint(const checkpoint::Checkpoint& c, std::uint64_t file_bytes) {
  std::string out;
  const auto created = std::chrono::system_clock::time_point(std::chrono::milliseconds(c.created_unix_ms()));
  const std::time_t t = std::chrono::system_clock::to_time_t(created);
  char when[64] = "?";
  std::tm tm{};
  if (gmtime_r(&t, &tm)) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  out += fmt::format("checkpoint {} of pipeline {} (seed {}), taken {}\n", c.sequence(), c.pipeline_file(), c.seed(), when);
  out += fmt::format("  {} elements had reached the sinks; the cut took {:.3f} s; {} bytes\n", c.sink_elements(), c.save_seconds(), file_bytes);
  if (c.python_state()) {
    const std::string base = c.stages_size() > 0            ? "this cut"
                             : c.continued_job_size() > 0 ? fmt::format("the run's start, continuing the states of {} workers", c.continued_job_size())
                                                          : "the run's start";
    out += fmt::format("  a Python state: {}; the loop had taken {} outputs after it (made again and dropped on resume{})\n", base,
                       c.outputs_to_skip(),
                       c.taken_known() ? fmt::format("; their {} records named, for a job of another number of workers", c.taken_record_size()) : "");
  }
  std::size_t id_width = 5, op_width = 8;
  for (const auto& s : c.stages()) {
    id_width = std::max(id_width, s.id().size());
    op_width = std::max(op_width, s.op().size());
  }
  out += fmt::format("  {:<{}}  {:<{}}  {:>9}  {:>10}  {}\n", "stage", id_width, "operator", op_width, "held", "state", "where");
  for (const auto& s : c.stages()) {
    std::size_t bytes = s.engine_state().size() + s.operator_state().size();
    std::size_t by_reference = 0;
    for (const auto& e : s.elements()) {
      bytes += e.has_ref() ? e.ref().ByteSizeLong() : e.value().size();
      by_reference += e.has_ref();
    }
    for (const auto& input : s.read_inputs()) bytes += input.ByteSizeLong();
    std::string where = s.ended() ? "ended" : s.summary();
    if (!s.operator_summary().empty()) where += (where.empty() ? "" : "; ") + s.operator_summary();
    if (by_reference > 0) where += fmt::format(" ({} by reference, read again on resume)", by_reference);
    out += fmt::format("  {:<{}}  {:<{}}  {:>9}  {:>8} B  {}\n", s.id(), id_width, s.op(), op_width, s.elements_size(), bytes, where);
  }
  return out;
}

void CheckpointStateWriter::put_bytes(const void* data, std::size_t size) { append(bytes_, data, size); }

void CheckpointStateWriter::put_element(const Sample& element) {
  append_u64(bytes_, static_cast<std::uint64_t>(stage_.elements_size()));
  auto* saved = stage_.add_elements();
  if (!reference_ || !reference_(element, *saved)) {
    saved->set_value(encode_sample(element));
    if (const auto epoch = read_epoch_of(element.shared_origin())) saved->set_read_epoch(*epoch);
  }
}

void CheckpointStateReader::get_bytes(void* data, std::size_t size) {
  if (size > bytes_.size() - at_)
    throw DataError(fmt::format("checkpoint state of {} is damaged or from another operator version: it ends early", what_));
  std::memcpy(data, bytes_.data() + at_, size);
  at_ += size;
}

Sample CheckpointStateReader::get_element() {
  const auto number = get<std::uint64_t>();
  if (number >= static_cast<std::uint64_t>(stage_.elements_size()))
    throw DataError(fmt::format("checkpoint state of {} is damaged: it names element {} of {}", what_, number, stage_.elements_size()));
  const auto& element = stage_.elements(static_cast<int>(number));
  if (element.has_ref() && !referenced_)
    throw DataError(fmt::format("checkpoint state of {} names element {} by reference, which cannot be read here", what_, number));
  Sample out = element.has_ref() ? referenced_(static_cast<std::size_t>(number))
                                 : decode_sample(element.value(), fmt::format("element {} of {}", number, what_));
  if (element.has_read_epoch()) detail::stamp_read_epoch(out, element.read_epoch());
  origins_given_.push_back(out.shared_origin());
  return out;
}

checkpoint::Checkpoint parse_state(const std::string& bytes, const std::string& what) {
  checkpoint::Checkpoint state;
  if (!state.ParseFromString(bytes) || state.format() != kCheckpointFormat)
    throw Error(what + " is not a Sluice pipeline state (or comes from another version)");
  if (state.undelivered_size() > 0)
    throw Error(what + " holds elements by value, as states of Sluice before positions-only states did: take a new state_dict() with "
                       "this version");
  return state;
}

std::vector<std::shared_ptr<const checkpoint::Checkpoint>> states_of_job(const std::vector<std::string>& states, const std::string& what) {
  std::vector<std::optional<checkpoint::Checkpoint>> parsed(states.size());
  const checkpoint::Checkpoint* any = nullptr;
  for (std::size_t w = 0; w < states.size(); ++w) {
    if (states[w].empty()) continue;
    parsed[w] = parse_state(states[w], fmt::format("the state of worker {} of {} {}", w, states.size(), what));
    if (!any) any = &*parsed[w];
  }
  std::vector<std::shared_ptr<const checkpoint::Checkpoint>> out;
  if (!any) return out;
  const checkpoint::Checkpoint model = *any;  // (the parsed states move into `out` below)
  any = &model;
  for (auto& p : parsed) {
    if (p) {
      out.push_back(std::make_shared<const checkpoint::Checkpoint>(std::move(*p)));
      continue;
    }
    auto finished = std::make_shared<checkpoint::Checkpoint>();
    finished->set_format(any->format());
    finished->set_seed(any->seed());
    finished->set_first_epoch(any->first_epoch());
    *finished->mutable_stages_identity() = any->stages_identity();
    finished->set_python_state(true);
    for (const auto& identity : any->stages_identity()) {
      auto* stage = finished->add_stages();
      stage->set_id(identity.id());
      stage->set_op(identity.op());
      stage->set_ended(true);
    }
    out.push_back(std::move(finished));
  }
  return out;
}

}  // namespace sluice
