// webdataset_reader (a tar shard's samples) and webdataset_writer (samples into tar shards).
#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "io_plugin.hpp"
#include "webdataset_format.hpp"

namespace fs = std::filesystem;

namespace sluice::io {
namespace {

// One sample per group of members sharing a key: a field per member named by its extension, as
// bytes, with '__key__' and '__url__' as webdataset gives them; fields named in `integers` become
// an int64, in `npy` a tensor; members ending in .gz are inflated first (the field loses .gz).
class WebDatasetReader final : public Expand {
 public:
  static OperatorInfo describe() {
    return {"webdataset_reader",
            OperatorKind::Expand,
            "Reads the WebDataset tar shard named by 'path' (plain, .tar.gz, .tar.zst): one sample per key, a bytes field per "
            "extension ('jpg', 'cls', 'json', ...), with '__key__' and '__url__'",
            {ParamSpec::make("field", ParamType::String, "field holding the shard's path").def("path"),
             ParamSpec::make("integers", ParamType::StringList, "fields whose text is one integer, parsed into an int64 (class labels)").def("cls"),
             ParamSpec::make("npy", ParamType::StringList, "fields holding NumPy .npy files, read into tensors").def("npy"),
             ParamSpec::make("inflate", ParamType::Bool, "inflate members ending in .gz (field 'txt' for a member 'x.txt.gz')").def("true"),
             ParamSpec::make("max_member_bytes", ParamType::Int,
                             "the most bytes a member may hold, read or inflated (more is damage named with the member: a compression bomb)")
                 .def(std::to_string(kDefaultMaxMemberBytes))
                 .range(1, std::nullopt)},
            {.stateless = true},
            {}};
  }
  explicit WebDatasetReader(const Params& p) : field_(p.get_string("field")) {
    fields_.inflate = p.get_bool("inflate");
    fields_.max_member_bytes = static_cast<std::uint64_t>(p.get_int("max_member_bytes"));
    for (const auto& f : p.get_string_list("integers")) fields_.integers.insert(f);
    for (const auto& f : p.get_string_list("npy")) fields_.npy.insert(f);
  }

  class Cursor final : public ExpandCursor {
   public:
    Cursor(const WebDatasetReader& op, std::string path, DamageReport& damage, Storage* storage)
        : op_(op), path_(std::make_shared<const std::string>(path)), url_(Tensor::from_string(path)), shard_(std::move(path), storage),
          damage_(damage) {
      shard_.set_max_member_bytes(op.fields_.max_member_bytes);
    }
    bool next(Sample& out) override {
      WebDatasetSample sample;
      for (;;) {
        if (!shard_.next(sample, damage_)) return false;
        try {
          out = op_.fields_.of(sample);
          break;
        } catch (const DataError& e) {
          const std::string reason = *path_ + ": sample '" + sample.key + "' (byte " + std::to_string(sample.header_offset) + "): " + e.what();
          if (!damage_.skip_damaged(reason)) throw DataError(reason);
        }
      }
      out.set("__url__", url_);
      out.set_origin(path_, sample.index, sample.header_offset);
      return true;
    }
    bool seek(std::int64_t record, std::int64_t byte_offset) override { return shard_.seek(record, byte_offset); }

   private:
    const WebDatasetReader& op_;
    std::shared_ptr<const std::string> path_;
    Tensor url_;
    WebDatasetShard shard_;
    DamageReport& damage_;
  };

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext& ctx, DamageReport& damage) override {
    return std::make_unique<Cursor>(*this, std::string(in.at(field_).string_at(0)), damage, ctx.stage ? ctx.stage->storage : nullptr);
  }

 private:
  std::string field_;
  WebDatasetFields fields_;
};

// Samples into tar shards PREFIX-000000.tar (webdataset's ShardWriter names), a member KEY.FIELD
// per field: bytes as they are, an integer scalar as its decimal text (a class label), other
// numbers as .npy. Each shard is written under a temporary name and renamed once it is closed;
// files of an earlier run numbered past this run's last shard go at the end. A checkpoint closes
// the open shard (a tar stream cannot be continued from a saved place): a resumed run goes on with
// the next number, after the shards published up to the checkpoint.
class WebDatasetWriter final : public Sink {
 public:
  static OperatorInfo describe() {
    return {"webdataset_writer",
            OperatorKind::Sink,
            "Writes elements as WebDataset tar shards PREFIX-000000.tar (a member KEY.FIELD per field), rotated by size or count",
            {ParamSpec::make("prefix", ParamType::OutputPath, "path prefix of the shards (folder/name)"),
             ParamSpec::make("max_records", ParamType::Int, "samples per shard").def("100000").range(1, std::nullopt),
             ParamSpec::make("max_bytes", ParamType::Int, "start a new shard past this many bytes").def("3000000000").range(1, std::nullopt),
             ParamSpec::make("compression", ParamType::Choice, "none: .tar, gzip: .tar.gz, zstd: .tar.zst").def("none").one_of({"none", "gzip", "zstd"}),
             ParamSpec::make("key", ParamType::String, "field naming each sample; absent from an element: its number, 9 digits").def("__key__")},
            {.saves_state = true},
            {}};
  }
  explicit WebDatasetWriter(const Params& p)
      : prefix_(p.get_string("prefix")),
        max_records_(static_cast<std::uint64_t>(p.get_int("max_records"))),
        max_bytes_(static_cast<std::uint64_t>(p.get_int("max_bytes"))),
        compression_(p.get_string("compression")),
        key_field_(p.get_string("key")) {
    if (prefix_.empty()) throw ParamError("prefix must not be empty");
  }
  ~WebDatasetWriter() override { close_archive(); }
  void start(const StageInfo& info) override {
    storage_ = info.storage;
    if (is_remote_uri(prefix_)) return;  // a bucket has no folders to make
    const fs::path folder = fs::path(prefix_).parent_path();
    std::error_code ec;
    if (!folder.empty()) fs::create_directories(folder, ec);
    if (ec) throw Error("cannot create folder " + folder.string() + " for prefix " + prefix_ + ": " + ec.message());
  }
  void consume(Sample in, const ElementContext&) override {
    if (!archive_) open_shard();
    const Tensor* key_tensor = in.find(key_field_);
    char number[16];
    std::snprintf(number, sizeof number, "%09llu", static_cast<unsigned long long>(written_));
    const std::string key = key_tensor && key_tensor->dtype() == DType::Bytes && key_tensor->num_elements() == 1 ? std::string(key_tensor->string_at(0)) : number;
    if (key.empty() || key.find('.', key.rfind('/') == std::string::npos ? 0 : key.rfind('/') + 1) != std::string::npos)
      throw DataError("sample key '" + key + "' is empty or has a dot in its file name; webdataset splits member names at the first dot");
    for (const auto& field : in.fields()) {
      if (field.name == key_field_ || field.name == "__url__") continue;
      add_member(key + "." + field.name, member_bytes(field.name, field.tensor));
    }
    ++written_;
    if (++shard_records_ >= max_records_ || shard_bytes_ >= max_bytes_) close_shard();
  }
  void finish(bool complete) override {
    if (!complete) {  // the open shard stays .partial, visibly incomplete
      close_archive();
      if (file_) file_.reset();
      return;
    }
    if (archive_) close_shard();
    remove_later_shards();
  }
  void save_state(StateWriter& w) const override { const_cast<WebDatasetWriter*>(this)->save_shards(w); }
  void restore_state(StateReader& r) override {
    const std::string prefix = r.get_string();
    const auto shards = r.get_within<std::uint64_t>(0, 1u << 30, "the number of shards");
    const auto written = r.get<std::uint64_t>();
    if (prefix != absolute_path(prefix_)) return;  // another prefix (--set): this run writes its own shards there
    for (std::size_t k = 0; k < shards; ++k)
      if (!fs::is_regular_file(shard_path(k)))
        throw Error(shard_path(k) + ", written before the checkpoint, is gone: resume cannot give the whole output; run again from the start");
    shards_ = static_cast<std::size_t>(shards);
    written_ = written;
    remove_later_shards();  // what the cut run wrote after the checkpoint is written again
  }

 private:
  static std::string member_bytes(const std::string& name, const Tensor& t) {
    if (t.dtype() == DType::Bytes) {
      if (t.num_elements() != 1) throw DataError("field '" + name + "' holds " + std::to_string(t.num_elements()) + " strings; a member holds one");
      return std::string(t.string_at(0));
    }
    if (t.rank() == 0 && (t.dtype() == DType::U8 || t.dtype() == DType::I16 || t.dtype() == DType::I32 || t.dtype() == DType::I64)) {
      std::int64_t v = t.dtype() == DType::U8 ? t.data<std::uint8_t>()[0] : t.dtype() == DType::I16 ? t.data<std::int16_t>()[0]
                       : t.dtype() == DType::I32 ? t.data<std::int32_t>()[0] : t.data<std::int64_t>()[0];
      return std::to_string(v);
    }
    return encode_npy(t);
  }
  std::string suffix() const { return compression_ == "gzip" ? ".tar.gz" : compression_ == "zstd" ? ".tar.zst" : ".tar"; }
  std::string shard_path(std::size_t index) const {
    char name[32];
    std::snprintf(name, sizeof name, "-%06zu", index);
    return prefix_ + name + suffix();
  }
  static la_ssize_t write_to_file(struct archive*, void* self, const void* data, size_t n) {
    auto* writer = static_cast<WebDatasetWriter*>(self);
    try {
      writer->file_->write(data, n);
      writer->shard_bytes_ += n;
      return static_cast<la_ssize_t>(n);
    } catch (const std::exception& e) {
      writer->write_error_ = e.what();
      return -1;
    }
  }
  void open_shard() {
    file_ = std::make_unique<AtomicOutputFile>(shard_path(shards_), storage_);
    archive_ = archive_write_new();
    archive_write_set_format_pax_restricted(archive_);  // ustar, with pax headers only for long names
    if (compression_ == "gzip") archive_write_add_filter_gzip(archive_);
    if (compression_ == "zstd") archive_write_add_filter_zstd(archive_);
    archive_write_set_bytes_in_last_block(archive_, 1);  // no padding of the last block to 10 KiB
    if (archive_write_open2(archive_, this, nullptr, &WebDatasetWriter::write_to_file, nullptr, nullptr) != ARCHIVE_OK)
      throw Error("cannot start " + file_->writing_path() + ": " + archive_error());
    shard_records_ = shard_bytes_ = 0;
  }
  void add_member(const std::string& name, const std::string& bytes) {
    archive_entry* entry = archive_entry_new();
    archive_entry_set_pathname(entry, name.c_str());
    archive_entry_set_size(entry, static_cast<la_int64_t>(bytes.size()));
    archive_entry_set_filetype(entry, AE_IFREG);
    archive_entry_set_perm(entry, 0444);
    archive_entry_set_mtime(entry, 0, 0);  // the same bytes from the same samples
    const bool ok = archive_write_header(archive_, entry) == ARCHIVE_OK &&
                    (bytes.empty() || archive_write_data(archive_, bytes.data(), bytes.size()) == static_cast<la_ssize_t>(bytes.size()));
    archive_entry_free(entry);
    if (!ok) throw Error("writing member " + name + " to " + file_->writing_path() + " failed: " + archive_error());
  }
  std::string archive_error() const {
    if (!write_error_.empty()) return write_error_;
    const char* why = archive_ ? archive_error_string(archive_) : nullptr;
    return why ? why : "unknown error";
  }
  void close_archive() {
    if (archive_) archive_write_free(archive_);
    archive_ = nullptr;
  }
  void close_shard() {
    const bool ok = archive_write_close(archive_) == ARCHIVE_OK;
    const std::string why = ok ? "" : archive_error();
    close_archive();
    if (!ok) throw Error("finishing " + file_->writing_path() + " failed: " + why);
    file_->commit();
    file_.reset();
    ++shards_;
  }
  void save_shards(StateWriter& w) {
    if (archive_) close_shard();
    w.put_string(absolute_path(prefix_));
    w.put<std::uint64_t>(shards_);
    w.put<std::uint64_t>(written_);
    w.describe(std::to_string(shards_) + " shard(s) of " + prefix_ + " published, " + std::to_string(written_) + " samples");
  }
  // Shards numbered from this run's next one on, published (an earlier run over this prefix that
  // wrote more, which a glob would read beside the new ones) or left partial (a run cut off after
  // a checkpoint, whose samples a resumed run writes again).
  void remove_later_shards() const {
    const fs::path folder = fs::path(prefix_).parent_path().empty() ? fs::path(".") : fs::path(prefix_).parent_path();
    const std::string stem = fs::path(prefix_).filename().string() + "-";
    std::error_code ec;
    std::vector<fs::path> doomed;
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.compare(0, stem.size(), stem) != 0 || name.size() < stem.size() + 6) continue;
      const std::string number = name.substr(stem.size(), 6), rest = name.substr(stem.size() + 6);
      if (!std::all_of(number.begin(), number.end(), ::isdigit) || std::stoul(number) < shards_) continue;
      if (rest == suffix() || rest.compare(0, suffix().size() + 9, suffix() + ".partial-") == 0) doomed.push_back(it->path());
    }
    for (const auto& path : doomed) fs::remove(path, ec);
  }

  std::string prefix_;
  std::uint64_t max_records_, max_bytes_;
  std::string compression_, key_field_;
  std::unique_ptr<AtomicOutputFile> file_;
  Storage* storage_ = nullptr;
  ::archive* archive_ = nullptr;
  std::string write_error_;
  std::size_t shards_ = 0;
  std::uint64_t written_ = 0, shard_records_ = 0, shard_bytes_ = 0;
};

}  // namespace

void register_webdataset(Registrar& registrar) {
  registrar.add<WebDatasetReader>();
  registrar.add<WebDatasetWriter>();
}

}  // namespace sluice::io
