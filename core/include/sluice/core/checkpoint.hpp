#pragma once
// Checkpoint files: a run's positions at one cut (checkpoint.proto), written atomically with a
// checksum so that a damaged or half-copied file is refused rather than resumed from.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint.pb.h"
#include "sluice/sample_codec.hpp"
#include "sluice/state.hpp"

namespace sluice {

inline constexpr std::uint32_t kCheckpointFormat = 1;
// The file a checkpoint directory holds; `--resume` takes the directory or the file.
inline constexpr const char* kCheckpointFileName = "checkpoint.sluice";

// DIR/checkpoint.sluice for a directory (existing or not, when it has no extension), else `path`.
std::filesystem::path checkpoint_file(const std::filesystem::path& dir_or_file);
// Writes under an exclusive temporary name, then renames: the previous checkpoint stays whole
// until the new one is. Creates the directory. Throws Error naming the path.
void write_checkpoint(const std::filesystem::path& file, const checkpoint::Checkpoint& checkpoint);
// Throws Error naming the file and what is wrong (missing, not a checkpoint, damaged, newer).
checkpoint::Checkpoint read_checkpoint(const std::filesystem::path& file);
// The checkpoint files a folder holds: checkpoint.sluice (one worker's: index -1) and the files of
// a job's workers, worker-I-of-N.sluice, ordered by N, then I.
struct FolderCheckpoint {
  std::string name;
  int index = -1, count = 1;
};
std::vector<FolderCheckpoint> checkpoints_in_folder(const std::filesystem::path& folder);

// What `sluice checkpoint info` prints.
std::string describe_checkpoint(const checkpoint::Checkpoint& checkpoint, std::uint64_t file_bytes);

// A state's bytes (a Python state_dict()'s), checked; throws Error naming it by `what`.
checkpoint::Checkpoint parse_state(const std::string& bytes, const std::string& what);
// The states of every worker of a job, in worker order, to continue on another number of workers
// (EngineOptions::resume_workers); an empty one is a worker that had finished its share of the
// epoch (its state between two iterations): the others' with every stage ended and holding
// nothing. Empty when every one is. Throws Error naming the worker whose state is not one.
std::vector<std::shared_ptr<const checkpoint::Checkpoint>> states_of_job(const std::vector<std::string>& states, const std::string& what);

// An operator's or the engine's state as bytes, with the elements it holds kept apart.
class CheckpointStateWriter final : public StateWriter {
 public:
  // `reference`, when given, may describe an element as a reference instead (true: it did).
  using Reference = std::function<bool(const Sample&, checkpoint::Element&)>;
  explicit CheckpointStateWriter(checkpoint::StageState& stage, std::string& bytes, std::string& summary, Reference reference = {})
      : stage_(stage), bytes_(bytes), summary_(summary), reference_(std::move(reference)) {}
  void put_bytes(const void* data, std::size_t size) override;
  void put_element(const Sample& element) override;
  void describe(std::string text) override { summary_ = std::move(text); }

 private:
  checkpoint::StageState& stage_;
  std::string& bytes_;
  std::string& summary_;
  Reference reference_;
};

class CheckpointStateReader final : public StateReader {
 public:
  // `what` names the state in errors ("stage 'shuffle' (operator state)").
  // `referenced` gives the element a reference names (read again); without it, references are refused.
  using Referenced = std::function<Sample(std::size_t number)>;
  CheckpointStateReader(const checkpoint::StageState& stage, const std::string& bytes, std::string what, Referenced referenced = {})
      : stage_(stage), bytes_(bytes), what_(std::move(what)), referenced_(std::move(referenced)) {}
  void get_bytes(void* data, std::size_t size) override;
  Sample get_element() override;
  bool at_end() const { return at_ == bytes_.size(); }
  // Where each element get_element() gave was read, in order (the rows a batch being gathered
  // holds, which its next output stacks).
  const std::vector<Origin>& origins_given() const { return origins_given_; }

 private:
  const checkpoint::StageState& stage_;
  const std::string& bytes_;
  std::string what_;
  Referenced referenced_;
  std::size_t at_ = 0;
  std::vector<Origin> origins_given_;
};

// Elements kept by value (and sent by the service's workers) are in the SDK's one binary form of
// a Sample: sluice/sample_codec.hpp (encode_sample, decode_sample).

}  // namespace sluice
