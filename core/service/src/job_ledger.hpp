#pragma once
// What the dispatcher knows of a job's splits in DYNAMIC mode (one ledger per job and epoch):
// which splits were handed out, to which worker, from which position, which are done, and where
// the epoch ends. A trainer asks for the next split and reads it from the worker named; when that
// worker stops answering, the trainer gives the split back with how many elements it received,
// and the next trainer to ask gets it again, from there, on another worker: nothing is delivered
// twice or lost. Pure bookkeeping: the dispatcher's gRPC calls and its journal drive it.
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace sluice::service {

class JobLedger {
 public:
  struct Given {
    std::uint64_t split = 0;
    std::uint64_t skip = 0;    // elements of it already delivered: the worker starts after them
    std::uint64_t worker = 0;  // who makes it
  };
  enum class Next { Split, Wait, End };

  // The next split for a trainer: one given back first (lowest first), else the next new one
  // (none past the epoch's end once known), made by the alive worker with the fewest splits in
  // hand (`alive` lists them; none: Wait). Wait: every split left is in another trainer's hands.
  Next next_split(const std::vector<std::uint64_t>& alive, Given& out);
  // Split `split` is delivered whole.
  void done(std::uint64_t split);
  // Its worker stopped answering after the trainer had received `received` of its elements in
  // all: it goes back, to be made again from there by another worker.
  void give_back(std::uint64_t split, std::uint64_t received);
  // The split has no element: the source ends before it, and so does the epoch.
  void ended_at(std::uint64_t split);
  // (A lost worker's splits are not given back here: only the trainer reading one knows how many
  // of its elements it received, and it gives the split back when its stream breaks.)

  bool finished() const { return end_ && in_hand_.empty() && given_back_.empty() && next_new_ >= *end_; }
  std::size_t in_hand() const { return in_hand_.size(); }
  std::size_t done_count() const { return done_.size(); }
  std::optional<std::uint64_t> end() const { return end_; }
  // Splits in each worker's hands.
  std::map<std::uint64_t, std::size_t> load() const;

 private:
  std::uint64_t next_new_ = 0;
  std::size_t turn_ = 0;  // where the search for the least loaded worker starts
  std::optional<std::uint64_t> end_;         // the first split past the source's end
  std::map<std::uint64_t, Given> in_hand_;   // by split
  std::map<std::uint64_t, std::uint64_t> given_back_;  // split -> skip
  std::set<std::uint64_t> done_;
};

}  // namespace sluice::service
