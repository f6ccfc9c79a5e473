#pragma once
// What the dispatcher knows of a job's splits (one ledger per job and epoch): which splits were
// handed out, to which worker, from which position, which are done, and where the epoch ends. A
// trainer asks for the next split and reads it from the worker named; when that worker stops
// answering, the trainer gives the split back with how many elements it received, and the next
// trainer to ask gets it again, from there, on another worker: nothing is delivered twice or
// lost. In DYNAMIC mode the splits are ranges of the source and the epoch ends at the first empty
// one; in OFF and static modes they are counted from the start (a copy of the dataset or a shard
// each), each made by its own worker while that one is alive. Pure bookkeeping: the dispatcher's
// gRPC calls drive it and its journal keeps it (save, restore).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace sluice::service {

namespace proto {
class LedgerState;
}

class JobLedger {
 public:
  struct Given {
    std::uint64_t split = 0;
    std::uint64_t skip = 0;    // elements of it already delivered: the worker starts after them
    std::uint64_t worker = 0;  // who makes it
    std::uint64_t lease = 0;   // this handing out: reports of an earlier one are ignored
    std::string reader;        // who it was handed to: only that reader reports on it
  };
  enum class Next { Split, Wait, End };

  JobLedger() = default;
  // OFF and static modes: the epoch has one split per entry of `preferred`, split k made by
  // worker preferred[k] whenever it is among those able to (else by the least loaded of them).
  explicit JobLedger(std::vector<std::uint64_t> preferred);

  // The next split for a trainer: one given back first (lowest first), else the next new one
  // (none past the epoch's end once known), made by its preferred worker or the able worker with
  // the fewest splits in hand (`able` lists them; none: Wait). Wait: every split left is in
  // another trainer's hands.
  Next next_split(const std::vector<std::uint64_t>& able, Given& out, const std::string& reader = {});
  // The split in hand under `lease`, or null.
  const Given* holding(std::uint64_t split, std::uint64_t lease) const;
  // The splits in hand, by split.
  const std::map<std::uint64_t, Given>& in_hand_splits() const { return in_hand_; }
  // The reports of a trainer about the split it was given with `lease`; false (nothing changed)
  // for a lease that is no longer the split's (a report sent twice, or a stale one).
  // Delivered whole:
  bool done(std::uint64_t split, std::uint64_t lease);
  // Its worker stopped answering after the trainer had received `received` of its elements in
  // all: it goes back, to be made again from there by another worker.
  bool give_back(std::uint64_t split, std::uint64_t lease, std::uint64_t received);
  // Coordinated reads: its worker stopped answering after the consumers had received what comes
  // before `skip`: the same split is handed out again at once (it keeps its place in its lane),
  // made by an able worker, under a new lease. Wait while no worker is able; End (nothing handed
  // out) for a lease that is no longer the split's.
  Next hand_again(std::uint64_t split, std::uint64_t lease, std::uint64_t skip, const std::vector<std::uint64_t>& able, Given& out);
  // DYNAMIC: the split has no element: the source ends before it, and so does the epoch.
  bool ended_at(std::uint64_t split, std::uint64_t lease);
  // (A lost worker's splits are not given back here: only the trainer reading one knows how many
  // of its elements it received, and it gives the split back when its stream breaks.)

  bool finished() const { return end_ && in_hand_.empty() && given_back_.empty() && next_new_ >= *end_; }
  bool fixed() const { return !preferred_.empty(); }
  std::size_t split_count() const { return preferred_.size(); }  // fixed ones
  std::size_t in_hand() const { return in_hand_.size(); }
  // Splits delivered whole: those handed out before the end, less those in hand or given back.
  std::size_t done_count() const;
  std::optional<std::uint64_t> end() const { return end_; }
  // Splits in each worker's hands.
  std::map<std::uint64_t, std::size_t> load() const;

  void save(proto::LedgerState& out) const;
  static JobLedger restore(const proto::LedgerState& state);

 private:
  bool holds(std::uint64_t split, std::uint64_t lease) const;
  // Its preferred worker when able, else the able one with the fewest splits in hand.
  std::uint64_t choose_worker(std::uint64_t split, const std::vector<std::uint64_t>& able);

  std::uint64_t next_new_ = 0;
  std::uint64_t next_lease_ = 1;
  std::size_t turn_ = 0;  // where the search for the least loaded worker starts
  std::optional<std::uint64_t> end_;         // the first split past the source's end
  std::map<std::uint64_t, Given> in_hand_;   // by split
  std::map<std::uint64_t, std::uint64_t> given_back_;  // split -> skip
  std::vector<std::uint64_t> preferred_;     // fixed splits: each one's worker
};

}  // namespace sluice::service
