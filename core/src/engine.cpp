#include "sluice/core/engine.hpp"

#include <algorithm>
#include <deque>
#include <exception>
#include <functional>
#include <system_error>
#include <optional>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include <pthread.h>

#include <fmt/format.h>

#include "autotune.hpp"
#include "channel.hpp"
#include "sluice/core/param_parse.hpp"
#include "sluice/core/report.hpp"
#include "sluice/core/resources.hpp"

namespace sluice {

using detail::Channel;
using detail::Item;
using detail::kAllIterations;
using detail::now_ns;

const char* run_state_name(RunState state) {
  switch (state) {
    case RunState::Created: return "created";
    case RunState::Running: return "running";
    case RunState::Finished: return "finished";
    case RunState::Stopped: return "stopped";
    case RunState::Failed: return "failed";
  }
  return "?";
}

namespace {

constexpr std::size_t kChunk = 64;
constexpr std::uint64_t kChunkWorkNs = 2'000'000;  // most work one chunk of a parallel stage holds
constexpr int kMaxChunksAhead = 4;                  // chunks in flight per worker, ordered output
constexpr std::uint64_t kElementMajorNs = 20'000;   // fused groups costlier per element go element by element

// A skip reason with its numbers (record indices, offsets, sizes) replaced by N, so that reasons of
// one kind are counted together.
std::string reason_kind(const std::string& reason) {
  std::string kind;
  kind.reserve(reason.size());
  for (std::size_t i = 0; i < reason.size(); ++i) {
    if (reason[i] >= '0' && reason[i] <= '9') {
      while (i + 1 < reason.size() && ((reason[i + 1] >= '0' && reason[i + 1] <= '9') || reason[i + 1] == '.')) ++i;
      kind += 'N';
    } else {
      kind += reason[i];
    }
  }
  return kind;
}
constexpr std::size_t kMaxReasonKinds = 50;

// Threads carry their stage's id (Linux keeps 15 characters), so that top -H, perf and gdb show
// which stage a busy thread belongs to.
void name_this_thread(const std::string& name) {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
#else
  (void)name;
#endif
}

struct Counters {
  std::atomic<std::uint64_t> elements_in{0}, elements_out{0}, bytes_in{0}, bytes_out{0};
  std::atomic<std::uint64_t> busy_ns{0}, starved_ns{0}, blocked_ns{0};
  std::atomic<std::uint64_t> errors_skipped{0}, epoch{0};
};

void add(std::atomic<std::uint64_t>& counter, std::uint64_t value) { counter.fetch_add(value, std::memory_order_relaxed); }

std::uint64_t bytes_of(const std::vector<Item>& items) {
  std::uint64_t n = 0;
  for (const auto& item : items) n += item.sample.nbytes();
  return n;
}

}  // namespace

// What went wrong in one chunk of an ordered parallel stage, reported on the chunk's commit turn
// so that reasons and failures come in input order whichever worker met them first.
struct StageRuntime;
struct ChunkIssues {
  std::string failure;
  const StageRuntime* failed_stage = nullptr;
  std::vector<std::pair<StageRuntime*, std::string>> skip_reasons;  // a fused group's members too
};

struct StageRuntime {
  const GraphStage* spec = nullptr;
  // Declared before `op`: the operator's code lives in the library this keeps loaded.
  std::shared_ptr<const RegisteredOperator> registered;
  std::unique_ptr<Operator> op;
  Source* source = nullptr;
  Map* map = nullptr;
  Filter* filter = nullptr;
  Expand* expand = nullptr;
  Aggregate* aggregate = nullptr;
  Sink* sink = nullptr;

  StageInfo info;
  std::unique_ptr<Channel> output;  // null for sinks
  Channel* input = nullptr;
  int input_stage = -1;
  int workers = 1;
  std::int64_t demand = 1;                // output iterations wanted (kUnbounded: forever)
  std::int64_t passes_per_iteration = 1;  // aggregates: input iterations per output iteration
  // The pipeline epochs of the first iteration of this stage's input (a source: of its first pass)
  // and of its output; they differ only after a repeat. Operators see these epochs, which are not
  // 0 when the run continues earlier ones (EngineOptions::first_epoch); channels count from 0.
  std::uint64_t first_input_epoch = 0, first_output_epoch = 0;
  bool keeps_reading = false;
  bool started = false;
  std::atomic<std::int64_t> expected_elements{0};  // sources: what the run will read, 0 unknown

  // Fusion: adjacent stateless maps (and a last filter) with the same parallelism run in the
  // workers of the first one, the head, without a channel between them. Each keeps its metrics.
  std::vector<StageRuntime*> fused;    // on the head: the members after it, in order
  StageRuntime* fused_head = nullptr;  // on a member: the head running it
  StageRuntime& exit() { return fused.empty() ? *this : *fused.back(); }
  // Threads the engine starts: an expand stage's one coordinator starts its own fetchers.
  int threads() const { return expand ? 1 : workers; }

  // Autotune: `workers` threads are started (the most the stage may get); those whose index is
  // at or above `active_workers` wait until the tuner raises it, and a worker above a lowered
  // count finishes its chunk first. Ordered commits make the count invisible in the output.
  bool tuned_workers = false, tuned_buffer = false;
  std::atomic<int> active_workers{1};
  std::atomic<bool> input_finished{false};  // parked workers leave once the input has ended
  std::mutex park_mutex;
  std::condition_variable park_cv;
  // Worker time available so far (active workers x time), for the busy fractions: guarded by
  // park_mutex.
  std::uint64_t worker_ns_before = 0, active_since_ns = 0;
  int running_workers() const { return tuned_workers ? active_workers.load(std::memory_order_relaxed) : workers; }
  double worker_capacity_ns(std::uint64_t now, std::uint64_t start) {
    if (!tuned_workers) return static_cast<double>(now - start) * workers;
    std::lock_guard lock(park_mutex);
    const std::uint64_t since = active_since_ns ? active_since_ns : start;
    return static_cast<double>(worker_ns_before) + static_cast<double>(now > since ? now - since : 0) * active_workers.load();
  }
  void set_active_workers(int count, std::uint64_t now, std::uint64_t start) {
    {
      std::lock_guard lock(park_mutex);
      const std::uint64_t since = active_since_ns ? active_since_ns : start;
      worker_ns_before += (now > since ? now - since : 0) * static_cast<std::uint64_t>(active_workers.load());
      active_since_ns = now;
      active_workers.store(count);
    }
    park_cv.notify_all();
  }
  void finish_input() {
    {
      std::lock_guard lock(park_mutex);
      input_finished.store(true);
    }
    park_cv.notify_all();
  }

  Counters counters;
  std::mutex reasons_mutex;
  std::vector<std::string> skip_reasons;
  std::map<std::string, std::uint64_t> skip_reason_counts;  // by reason_kind()

  // Shared by the workers of one stage: input order, iteration bookkeeping and ordered commits.
  std::mutex pop_mutex;
  std::uint64_t next_seq = 0;
  std::uint64_t in_iteration = 0, in_index = 0;
  bool input_done = false;
  std::mutex commit_mutex;
  std::condition_variable commit_cv;
  std::uint64_t next_commit = 0;
  int in_flight = 0;  // chunks taken and not yet committed
  // Ordered output: chunks finished before their turn wait here (by sequence number) while their
  // worker goes on with the next one; whoever finishes the chunk in turn commits the run of them.
  struct FinishedChunk {
    std::vector<Item> out;
    ChunkIssues issues;
    bool ok = true;
  };
  std::map<std::uint64_t, FinishedChunk> finished;
  // Recent cost of one element through the stage (or its fused group): sizes chunks, and picks
  // element-major order for expensive fused groups (see process_chunk).
  std::atomic<std::uint64_t> ns_per_element{0};

  // For the recent rates of snapshots.
  std::uint64_t previous_ns = 0, previous_elements = 0, previous_bytes = 0;
  std::vector<std::uint64_t> previous_device_bytes;  // feed sinks: per device
};

struct Engine::Impl {
  Graph graph;
  EngineOptions options;
  std::vector<std::unique_ptr<StageRuntime>> stages;
  std::atomic<bool> stopping{false};
  std::atomic<int> state{static_cast<int>(RunState::Created)};
  std::atomic<int> sinks_done{0};
  int sink_count = 0;

  std::mutex done_mutex;
  std::condition_variable done_cv;
  int live_workers = 0;
  std::once_flag finalized;
  std::vector<std::thread> threads;

  mutable std::mutex error_mutex;
  bool failed = false;
  std::string error;
  std::string failed_stage;  // the stage the error is about, when it is about one

  std::uint64_t start_ns = 0;
  std::atomic<std::uint64_t> end_ns{0};

  std::vector<std::function<void(const metrics::MetricsSnapshot&)>> subscribers;
  std::thread publisher;
  std::mutex publish_mutex;
  std::condition_variable publish_cv;
  bool publisher_quit = false;
  mutable std::mutex snapshot_mutex;
  mutable std::uint64_t sequence = 0;

  // Autotune (graph.autotunes()): the budgets, the tuner's thread and what it decided.
  bool autotune = false;
  double cpu_budget = 0;
  std::string cpu_budget_source, ram_budget_source;
  std::uint64_t ram_budget = 0, buffer_budget = 0;
  std::thread tuner;
  mutable std::mutex tune_mutex;
  std::vector<metrics::AutotuneChange> tune_changes;
  std::uint64_t tune_changes_left_out = 0;
  // The CPU budget at every moment: a worker of a tuned stage holds one of `cores_total` while it
  // computes, so that generous worker counts (a worker is not a core) never add up to more.
  std::mutex cores_mutex;
  std::condition_variable cores_cv;
  int cores_total = 1, cores_in_use = 0;

  // Holds a core of the budget for a tuned stage's work (nothing for other stages).
  class CoreHold {
   public:
    CoreHold(Impl& impl, const StageRuntime& st) : impl_(impl), counted_(st.tuned_workers) {
      if (!counted_) return;
      std::unique_lock lock(impl_.cores_mutex);
      while (impl_.cores_in_use >= impl_.cores_total && !impl_.stopping.load())
        impl_.cores_cv.wait_for(lock, std::chrono::milliseconds(50));
      held_ = !impl_.stopping.load();
      if (held_) ++impl_.cores_in_use;
    }
    ~CoreHold() {
      if (!counted_ || !held_) return;
      {
        std::lock_guard lock(impl_.cores_mutex);
        --impl_.cores_in_use;
      }
      impl_.cores_cv.notify_one();
    }
    CoreHold(const CoreHold&) = delete;
    CoreHold& operator=(const CoreHold&) = delete;
    bool held() const { return held_ || !counted_; }

   private:
    Impl& impl_;
    bool counted_, held_ = false;
  };
  void set_cores_for_tuned(int count) {
    {
      std::lock_guard lock(cores_mutex);
      cores_total = std::max(1, count);
    }
    cores_cv.notify_all();
  }

  // ---- control ----

  void request_stop() {
    stopping.store(true);
    for (auto& st : stages) {
      if (st->output) st->output->wake_all();
      {
        std::lock_guard lock(st->commit_mutex);
        st->commit_cv.notify_all();
      }
      // A stage blocked inside its own call (a feed sink waiting for a device slot) is told too.
      if (state.load() == static_cast<int>(RunState::Running)) {
        try {
          st->op->cancel();
        } catch (...) {
        }
      }
    }
  }

  void fail(const std::string& message, const StageRuntime* at = nullptr) {
    {
      std::lock_guard lock(error_mutex);
      if (!failed) {
        failed = true;
        error = message;
        if (at) failed_stage = at->spec->id;
      }
    }
    request_stop();
  }

  std::string stage_label(const StageRuntime& st) const {
    return fmt::format("stage '{}' ({})", st.spec->id, st.spec->op->info.name);
  }

  // Handles an exception thrown by an operator for one element. Returns true to go on.
  // With `deferred`, the reason or failure is stored there instead (see ChunkIssues).
  // Called inside a catch block. Running out of memory is no element's fault: it ends the run
  // under any policy, blamed on the stage that asked, with no advice to skip elements.
  bool element_error(StageRuntime& st, const char* what, std::uint64_t epoch, std::uint64_t index,
                     const std::string& origin, ChunkIssues* deferred = nullptr) {
    if (handling_out_of_memory()) {
      fail_or_defer(st, out_of_memory_message(st), deferred);
      return false;
    }
    std::string where = fmt::format("element {} of epoch {}{}", index, epoch, origin.empty() ? "" : " from " + origin);
    if (st.spec->error_policy == ErrorPolicyKind::Skip) {
      add(st.counters.errors_skipped, 1);
      if (deferred) deferred->skip_reasons.emplace_back(&st, where + ": " + what);
      else keep_skip_reason(st, where + ": " + what);
      return true;
    }
    std::string message = fmt::format(
        "{} failed on {}: {}\n  (set `error_policy: skip` on this stage to drop such elements and go on)", stage_label(st),
        where, what);
    fail_or_defer(st, std::move(message), deferred);
    return false;
  }

  // Ends the run blaming `st` now, or, with `deferred`, when its chunk is committed in order.
  void fail_or_defer(StageRuntime& st, std::string message, ChunkIssues* deferred) {
    if (deferred) {
      deferred->failure = std::move(message);
      deferred->failed_stage = &st;
    } else {
      fail(message, &st);
    }
  }

  static bool handling_out_of_memory() {
    if (!std::current_exception()) return false;
    try {
      std::rethrow_exception(std::current_exception());
    } catch (const std::bad_alloc&) {
      return true;
    } catch (...) {
    }
    return false;
  }
  std::string out_of_memory_message(const StageRuntime& st) const {
    return fmt::format("{} ran out of memory: the process could not get the memory it asked for (lower buffer_size, "
                       "batch_size, parallelism or cycle_length, or give the process more memory); no element is at fault",
                       stage_label(st));
  }

  void keep_skip_reason(StageRuntime& st, std::string reason) {
    std::string kind = reason_kind(reason);
    std::lock_guard lock(st.reasons_mutex);
    if (auto it = st.skip_reason_counts.find(kind); it != st.skip_reason_counts.end()) ++it->second;
    else st.skip_reason_counts.emplace(st.skip_reason_counts.size() < kMaxReasonKinds ? std::move(kind) : "(other reasons)", 1);
    if (st.skip_reasons.size() < options.kept_skip_reasons) st.skip_reasons.push_back(std::move(reason));
  }

  void report_issues(ChunkIssues& issues) {
    for (auto& [stage, reason] : issues.skip_reasons) keep_skip_reason(*stage, std::move(reason));
    if (!issues.failure.empty()) fail(issues.failure, issues.failed_stage);
  }

  // The consumer `st` wants nothing more of its input iterations <= `iteration`; tell every stage
  // upstream at once, so a source stops producing what would only be thrown away.
  void skip_input(StageRuntime& st, std::int64_t iteration) {
    if (st.fused_head) {
      skip_input(*st.fused_head, iteration);
      return;
    }
    if (!st.input || st.input->skip_through.load() >= iteration) return;
    st.input->request_skip(iteration);
    StageRuntime& producer = *stages[st.input_stage];
    if (producer.source) return;  // a source watches its output channel
    if (!producer.aggregate) {
      skip_input(producer, iteration);
      return;
    }
    if (producer.keeps_reading && iteration != kAllIterations) return;
    const std::int64_t per = producer.passes_per_iteration;
    if (per == 0) return;
    std::int64_t upstream = kAllIterations;
    if (per != kUnbounded && iteration != kAllIterations && iteration < kAllIterations / per - 1)
      upstream = (iteration + 1) * per - 1;
    skip_input(producer, upstream);
  }

  // Hands `out` to the stage's output channel (its group's, when fused); the wait counts as blocked.
  bool flush(StageRuntime& st, std::vector<Item>& out) {
    if (out.empty()) return !stopping.load(std::memory_order_relaxed);
    StageRuntime& exit = st.exit();
    std::uint64_t t0 = now_ns();
    bool ok = exit.output->push(out);
    add(exit.counters.blocked_ns, now_ns() - t0);
    return ok;
  }

  // ---- workers ----

  class CollectingEmitter final : public Emitter {
   public:
    CollectingEmitter(Impl& impl, StageRuntime& st, std::vector<Item>& out) : impl_(impl), st_(st), out_(out) {}
    std::uint64_t iteration = 0;
    bool push(Sample sample) override {
      if (impl_.stopping.load(std::memory_order_relaxed) || st_.exit().output->skipped(iteration)) return false;
      add(st_.counters.elements_out, 1);
      add(st_.counters.bytes_out, sample.nbytes());
      out_.push_back(Item::element(std::move(sample)));
      if (out_.size() >= kChunk) return impl_.flush(st_, out_);
      return true;
    }

   private:
    Impl& impl_;
    StageRuntime& st_;
    std::vector<Item>& out_;
  };

  void run_source(StageRuntime& st) {
    std::vector<Item> out;
    out.reserve(kChunk);
    std::uint64_t mark = now_ns();
    std::uint64_t produced = 0, produced_bytes = 0;
    auto handover = [&]() {
      std::uint64_t t = now_ns();
      add(st.counters.busy_ns, t - mark);
      add(st.counters.elements_out, produced);
      add(st.counters.bytes_out, produced_bytes);
      produced = produced_bytes = 0;
      bool ok = flush(st, out);
      mark = now_ns();
      return ok;
    };
    for (std::uint64_t pass = 0; st.demand == kUnbounded || pass < static_cast<std::uint64_t>(st.demand); ++pass) {
      if (stopping.load() || st.output->skip_through.load() == kAllIterations) break;
      const std::uint64_t epoch = st.first_output_epoch + pass;
      if (!st.output->skipped(pass)) {
        try {
          st.source->begin_pass(epoch);
        } catch (const std::exception& e) {
          fail(fmt::format("{} could not begin pass {}: {}", stage_label(st), epoch, e.what()), &st);
          return;
        }
        ElementContext ctx{&st.info, epoch, 0};
        while (!stopping.load(std::memory_order_relaxed) && !st.output->skipped(pass)) {
          Sample sample;
          try {
            if (!st.source->next(sample, ctx)) break;
          } catch (const std::exception& e) {
            if (!element_error(st, e.what(), epoch, ctx.index, sample.origin())) return;
            ++ctx.index;
            continue;
          }
          ++ctx.index;
          ++produced;
          produced_bytes += sample.nbytes();
          out.push_back(Item::element(std::move(sample)));
          // Hand over full chunks; to a waiting consumer, hand over sooner, but not element by
          // element from a fast source (each hand-off may wake a thread).
          bool due = out.size() >= kChunk ||
                     (st.output->consumer_waiting() && (out.size() >= kChunk / 4 || now_ns() - mark >= 50'000));
          if (due && !handover()) return;
        }
      }
      out.push_back(Item::end_of_iteration(pass));
      if (!handover()) return;
      st.counters.epoch.store(pass + 1, std::memory_order_relaxed);
    }
    out.push_back(Item::end_of_stream());
    handover();
  }

  // A tuned stage's worker above the active count waits here; false when it should leave (the
  // run stops, or the stage's input ended).
  bool wait_until_active(StageRuntime& st, int index) {
    std::unique_lock lock(st.park_mutex);
    while (index >= st.active_workers.load() && !stopping.load() && !st.input_finished.load())
      st.park_cv.wait_for(lock, std::chrono::milliseconds(50));
    return !stopping.load() && !st.input_finished.load();
  }

  // Map, filter, expand and sink stages: one or more workers take chunks of the input in order,
  // process them concurrently and commit their outputs in input order (deterministic) or as they
  // finish. Control items wait until every earlier chunk is committed.
  void run_stateless(StageRuntime& st, int index) {
    const bool ordered = graph.deterministic && st.workers > 1;
    std::vector<Item> in, out;
    in.reserve(kChunk);
    for (;;) {
      if (st.tuned_workers && index >= st.active_workers.load(std::memory_order_relaxed) && !wait_until_active(st, index)) return;
      std::uint64_t seq = 0, epoch = 0, base_index = 0;
      std::uint64_t t0 = now_ns();
      {
        std::lock_guard pop_lock(st.pop_mutex);
        if (st.input_done) return;
        if (ordered) {
          // Workers run ahead of the oldest unfinished chunk by a bounded amount (memory).
          std::unique_lock lock(st.commit_mutex);
          std::uint64_t w0 = now_ns();
          st.commit_cv.wait(lock, [&] { return st.in_flight < kMaxChunksAhead * st.running_workers() || stopping.load(); });
          add(st.counters.blocked_ns, now_ns() - w0);
          t0 = now_ns();
        }
        if (stopping.load()) return;
        // A fair share of what is waiting, and no more than a few milliseconds of work, so that
        // at the end of the input no worker is left alone with a long chunk.
        const std::size_t share = std::max<std::size_t>(1, st.input->available() / static_cast<std::size_t>(st.running_workers()));
        const std::uint64_t cost = st.ns_per_element.load(std::memory_order_relaxed);
        const std::size_t by_time = cost > 0 ? static_cast<std::size_t>(std::max<std::uint64_t>(1, kChunkWorkNs / cost)) : kChunk;
        if (!st.input->pop(in, std::min({kChunk, share, by_time}))) return;
        add(st.counters.starved_ns, now_ns() - t0);
        if (!in.front().is_element()) {
          {
            std::unique_lock lock(st.commit_mutex);
            std::uint64_t w0 = now_ns();
            st.commit_cv.wait(lock, [&] { return st.in_flight == 0 || stopping.load(); });
            add(st.counters.blocked_ns, now_ns() - w0);
          }
          if (stopping.load()) return;
          Item control = std::move(in.front());
          if (control.kind == Item::Kind::EndOfStream) {
            st.input_done = true;
            if (st.tuned_workers) st.finish_input();
          }
          if (control.kind == Item::Kind::EndOfIteration) {
            if (st.sink) {
              try {
                st.sink->end_iteration(st.first_input_epoch + st.in_iteration);
              } catch (const std::exception& e) {
                fail(fmt::format("{} failed at the end of epoch {}: {}", stage_label(st), st.first_input_epoch + st.in_iteration,
                                 e.what()), &st);
                return;
              }
            }
            ++st.in_iteration;
            st.in_index = 0;
            st.counters.epoch.store(st.in_iteration, std::memory_order_relaxed);
            for (auto* member : st.fused) member->counters.epoch.store(st.in_iteration, std::memory_order_relaxed);
          }
          if (!st.sink) {
            out.push_back(std::move(control));
            if (!flush(st, out)) return;
          } else if (st.input_done) {
            sinks_done.fetch_add(1);
          }
          if (st.input_done) return;
          continue;
        }
        seq = st.next_seq++;
        epoch = st.in_iteration;
        base_index = st.in_index;
        st.in_index += in.size();
        std::lock_guard lock(st.commit_mutex);
        ++st.in_flight;
      }
      add(st.counters.elements_in, in.size());
      add(st.counters.bytes_in, bytes_of(in));

      bool ok = true;
      ChunkIssues issues;
      if (!st.input->skipped(epoch)) {
        CoreHold core(*this, st);
        ok = core.held() && process_chunk(st, in, out, st.first_input_epoch + epoch, base_index, ordered ? &issues : nullptr);
      }
      in.clear();
      std::uint64_t t2 = now_ns();

      if (!ordered) {
        if (ok && !st.sink && !out.empty()) ok = st.exit().output->push(out);
        out.clear();
        {
          std::lock_guard lock(st.commit_mutex);
          --st.in_flight;
          st.commit_cv.notify_all();
        }
      } else {
        std::unique_lock lock(st.commit_mutex);
        st.finished.emplace(seq, StageRuntime::FinishedChunk{std::move(out), std::move(issues), ok});
        out = {};
        // Taking the chunk in turn out of `finished` makes this thread its only committer.
        for (auto it = st.finished.find(st.next_commit); it != st.finished.end(); it = st.finished.find(st.next_commit)) {
          StageRuntime::FinishedChunk chunk = std::move(it->second);
          st.finished.erase(it);
          lock.unlock();
          report_issues(chunk.issues);
          bool pushed = !chunk.ok || st.sink || chunk.out.empty() || st.exit().output->push(chunk.out);
          lock.lock();
          ++st.next_commit;
          --st.in_flight;
          st.commit_cv.notify_all();
          if (!chunk.ok || !pushed) {
            ok = false;
            break;
          }
        }
      }
      add(st.exit().counters.blocked_ns, now_ns() - t2);
      if (!ok || stopping.load()) return;
    }
  }

  // Runs one element through one stage: a map replaces the sample, a filter may drop it (`kept`
  // false), a sink consumes it. False when the run must stop (fail policy).
  bool apply(StageRuntime& st, Item& item, const ElementContext& ctx, bool& kept, ChunkIssues* deferred_failure) {
    const Origin origin = item.sample.shared_origin();  // the operator may consume the sample
    try {
      if (st.map) {
        item.sample = st.map->map(std::move(item.sample), ctx);
      } else if (st.filter) {
        kept = st.filter->keep(item.sample, ctx);
      } else if (st.sink) {
        st.sink->consume(std::move(item.sample), ctx);
      }
      return true;
    } catch (const std::exception& e) {
      kept = false;
      return element_error(st, e.what(), ctx.epoch, ctx.index, origin.text(), deferred_failure);
    }
  }

  // Runs one chunk through the stage, or through every member of its fused group. In a group,
  // every member sees the element's index at the group's input: maps keep positions, and a filter
  // can only be the last member. Cheap elements go stage by stage over the whole chunk (one clock
  // reading per stage and chunk); expensive ones (decoded images) go element by element through
  // all members, so that each stays in cache from one stage to the next.
  bool process_chunk(StageRuntime& st, std::vector<Item>& in, std::vector<Item>& out, std::uint64_t epoch,
                     std::uint64_t base_index, ChunkIssues* deferred_failure) {
    std::vector<StageRuntime*> members{&st};
    members.insert(members.end(), st.fused.begin(), st.fused.end());
    struct Tally {
      std::uint64_t in = 0, in_bytes = 0, out = 0, out_bytes = 0, busy = 0;
    };
    std::vector<Tally> tally(members.size());
    bool ok = true;
    const std::uint64_t start = now_ns();
    if (members.size() > 1 && st.ns_per_element.load(std::memory_order_relaxed) > kElementMajorNs) {
      for (std::size_t i = 0; i < in.size() && ok; ++i) {
        Item& item = in[i];
        ElementContext ctx{nullptr, epoch, base_index + i};
        bool kept = true;
        std::uint64_t t = now_ns();
        for (std::size_t m = 0; m < members.size() && kept && ok; ++m) {
          if (m > 0) {
            ++tally[m].in;
            tally[m].in_bytes += item.sample.nbytes();
          }
          ctx.stage = &members[m]->info;
          ok = apply(*members[m], item, ctx, kept, deferred_failure);
          if (kept) {
            ++tally[m].out;
            tally[m].out_bytes += item.sample.nbytes();
          }
          std::uint64_t t2 = now_ns();
          tally[m].busy += t2 - t;
          t = t2;
        }
        if (kept && ok) out.push_back(std::move(item));
        if (stopping.load(std::memory_order_relaxed)) ok = false;
      }
    } else {
      std::vector<std::uint64_t> positions(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) positions[i] = base_index + i;
      for (std::size_t m = 0; m < members.size() && ok; ++m) {
        if (m > 0) {
          in.swap(out);
          out.clear();
          tally[m].in = in.size();
          tally[m].in_bytes = bytes_of(in);
        }
        const std::uint64_t t0 = now_ns();
        ElementContext ctx{&members[m]->info, epoch, 0};
        std::size_t kept_count = 0;
        for (std::size_t i = 0; i < in.size() && ok; ++i) {
          ctx.index = positions[i];
          bool kept = true;
          const std::size_t sink_bytes = members[m]->sink ? in[i].sample.nbytes() : 0;
          ok = apply(*members[m], in[i], ctx, kept, deferred_failure);
          if (kept && ok) {
            ++tally[m].out;
            tally[m].out_bytes += sink_bytes;
            if (!members[m]->sink) {
              tally[m].out_bytes += in[i].sample.nbytes();
              positions[kept_count++] = positions[i];
              out.push_back(std::move(in[i]));
            }
          }
          if (stopping.load(std::memory_order_relaxed)) ok = false;
        }
        positions.resize(kept_count);
        tally[m].busy = now_ns() - t0;
      }
    }
    for (std::size_t m = 0; m < members.size(); ++m) {
      auto& c = members[m]->counters;
      if (m > 0) {
        add(c.elements_in, tally[m].in);
        add(c.bytes_in, tally[m].in_bytes);
      }
      add(c.elements_out, tally[m].out);
      add(c.bytes_out, tally[m].out_bytes);
      add(c.busy_ns, tally[m].busy);
    }
    if (!in.empty()) {
      const std::uint64_t per_element = (now_ns() - start) / in.size();
      st.ns_per_element.store(per_element, std::memory_order_relaxed);
    }
    return ok;
  }

  // Expand stages, with tf.data's interleave: up to cycle_length inputs are open at once, and
  // block_length outputs are taken from each in turn; an exhausted input's slot takes the next
  // input. With parallelism > 1, fetcher threads read ahead from the open inputs; the output order
  // stays the sequential one unless the stage asks for completion order.
  class StageDamage final : public DamageReport {
   public:
    StageDamage(Impl& impl, StageRuntime& st) : impl_(impl), st_(st) {}
    bool skip_damaged(const std::string& reason) override {
      if (st_.spec->error_policy != ErrorPolicyKind::Skip) return false;
      add(st_.counters.errors_skipped, 1);
      impl_.keep_skip_reason(st_, reason);
      return true;
    }

   private:
    Impl& impl_;
    StageRuntime& st_;
  };

  struct ExpandSlot {
    std::unique_ptr<ExpandCursor> cursor;
    std::deque<Sample> ready;  // read ahead by fetchers
    bool exhausted = false;
    bool busy = false;  // a fetcher is inside cursor->next()
    std::string origin;
    std::uint64_t epoch = 0, index = 0;
    // Outputs its cursor gave so far; written only by the thread calling the cursor (one at a time).
    std::uint64_t outputs_read = 0;
    // A tuned stage reading on its coordinator holds its slots (busy) until it hands them back to
    // fetchers: no lock and no wake-up per record. Written by the coordinator only.
    bool owned = false;
  };

  void run_expand(StageRuntime& st) {
    const std::size_t cycle = static_cast<std::size_t>(std::max(1, st.spec->cycle_length));
    const int block = std::max(1, st.spec->block_length);
    const bool ordered = st.spec->interleave_deterministic.value_or(graph.deterministic);
    const int fetcher_count = st.workers > 1 ? std::min<int>(st.workers, static_cast<int>(cycle)) : 0;
    // A tuned stage given one worker reads on its coordinator, its fetchers parked.
    auto reading_alone = [&] { return st.tuned_workers && st.active_workers.load(std::memory_order_relaxed) <= 1; };
    std::optional<CoreHold> reading_core;  // the coordinator's core of the budget while it reads
    std::size_t reads_on_core = 0;
    const std::size_t read_ahead = static_cast<std::size_t>(std::max(2, block));
    StageDamage damage(*this, st);
    std::vector<ExpandSlot> slots(cycle);
    std::mutex mutex;  // guards slots' ready/exhausted/busy/cursor when fetchers run
    std::condition_variable changed;
    auto release_owned = [&](ExpandSlot& slot) {
      if (!slot.owned) return;
      {
        std::lock_guard lock(mutex);
        slot.busy = slot.owned = false;
      }
      changed.notify_all();
    };
    auto release_all_owned = [&] {
      for (auto& slot : slots) release_owned(slot);
    };
    bool quit = false;
    std::vector<Item> inputs, out;
    std::size_t next_input = 0;
    std::uint64_t epoch = 0, index = 0;
    bool iteration_closed = false, input_done = false;
    // The coordinator's busy time: its time less what it spent waiting (fetchers add their own).
    std::uint64_t mark = now_ns(), waited_at_mark = st.counters.starved_ns.load() + st.counters.blocked_ns.load();
    auto account_busy = [&]() {
      std::uint64_t now = now_ns(), waited = st.counters.starved_ns.load() + st.counters.blocked_ns.load();
      std::uint64_t spent = now - mark, idle = waited - waited_at_mark;
      add(st.counters.busy_ns, spent > idle ? spent - idle : 0);
      mark = now;
      waited_at_mark = waited;
    };

    auto stop_fetchers = [&](std::vector<std::thread>& fetchers) {
      {
        std::lock_guard lock(mutex);
        quit = true;
      }
      changed.notify_all();
      for (auto& t : fetchers)
        if (t.joinable()) t.join();
    };
    // An input that fails part-way loses the outputs it had left: the reason says how many it gave
    // first, so that one skipped input is not mistaken for one lost record.
    auto input_failure = [&](ExpandSlot& slot, const char* what) {
      const std::string reason = slot.outputs_read == 0
                                     ? fmt::format("{} (the whole input was dropped; it gave no output)", what)
                                     : fmt::format("{} (the rest of this input was dropped after its first {} outputs)", what,
                                                   slot.outputs_read);
      return element_error(st, reason.c_str(), st.first_input_epoch + slot.epoch, slot.index, slot.origin);
    };
    // Opens the next input of the current iteration into `slot`; false if the run must stop.
    auto fill = [&](ExpandSlot& slot) -> bool {
      while (!iteration_closed) {
        if (next_input == inputs.size()) {
          if (!out.empty() && !flush(st, out)) return false;  // never hold outputs while waiting
          account_busy();
          std::uint64_t t0 = now_ns();
          reading_core.reset();  // no core held while waiting for inputs
          if (!st.input->pop(inputs, kChunk)) return false;
          add(st.counters.starved_ns, now_ns() - t0);
          next_input = 0;
          if (inputs.front().is_element()) {
            add(st.counters.elements_in, inputs.size());
            add(st.counters.bytes_in, bytes_of(inputs));
          }
        }
        Item& item = inputs[next_input++];
        if (!item.is_element()) {
          iteration_closed = true;
          input_done = item.kind == Item::Kind::EndOfStream;
          return true;
        }
        const std::uint64_t my_index = index++;
        if (st.input->skipped(epoch)) continue;
        std::string origin = item.sample.origin();
        try {
          auto cursor = st.expand->open(std::move(item.sample), ElementContext{&st.info, st.first_input_epoch + epoch, my_index}, damage);
          std::lock_guard lock(mutex);
          slot = ExpandSlot{};
          slot.cursor = std::move(cursor);
          slot.exhausted = !slot.cursor;
          slot.origin = std::move(origin);
          slot.epoch = epoch;
          slot.index = my_index;
          changed.notify_all();
          return true;
        } catch (const std::exception& e) {
          if (!element_error(st, e.what(), st.first_input_epoch + epoch, my_index, origin)) return false;
        }
      }
      return true;
    };
    // The next output of `slot`: 1 produced, 0 exhausted, -1 the run must stop.
    auto take = [&](ExpandSlot& slot, Sample& sample) -> int {
      for (;;) {
        if (fetcher_count == 0) {
          try {
            if (!slot.cursor->next(sample)) return 0;
            ++slot.outputs_read;
            return 1;
          } catch (const std::exception& e) {
            return input_failure(slot, e.what()) ? 0 : -1;
          }
        }
        if (reading_alone()) {
          // The tuner gave the stage one worker: the coordinator reads itself, as an untuned stage
          // with one worker does (a hand-off per record costs more than small records do), after
          // what fetchers had read ahead. It holds the slot meanwhile, so that a fetcher woken by a
          // new count does not read the same input.
          if (!slot.owned) {
            std::unique_lock lock(mutex);
            while (!changed.wait_for(lock, std::chrono::milliseconds(50), [&] { return !slot.busy || stopping.load(); })) {
            }
            if (stopping.load()) return -1;
            if (!slot.ready.empty()) {
              sample = std::move(slot.ready.front());
              slot.ready.pop_front();
              return 1;
            }
            if (slot.exhausted) return 0;
            slot.busy = slot.owned = true;
          }
          // A core of the budget, held for a run of records rather than taken for each.
          if (!reading_core) reading_core.emplace(*this, st);
          if (!reading_core->held()) return -1;
          if (++reads_on_core >= kChunk) {
            reading_core.reset();
            reads_on_core = 0;
          }
          int got = 0;
          try {
            got = slot.cursor->next(sample) ? 1 : 0;
            slot.outputs_read += static_cast<std::uint64_t>(got);
          } catch (const std::exception& e) {
            got = input_failure(slot, e.what()) ? 0 : -1;
          }
          if (got <= 0) {
            release_owned(slot);
            if (got == 0) {
              std::lock_guard lock(mutex);
              slot.exhausted = true;
            }
          }
          return got;
        }
        reading_core.reset();
        release_all_owned();
        std::unique_lock lock(mutex);
        if (slot.ready.empty() && !slot.exhausted && !out.empty()) {
          lock.unlock();
          if (!flush(st, out)) return -1;
          lock.lock();
        }
        std::uint64_t t0 = now_ns();
        while (!changed.wait_for(lock, std::chrono::milliseconds(50),
                                 [&] { return !slot.ready.empty() || slot.exhausted || stopping.load() || reading_alone(); })) {
        }
        add(st.counters.starved_ns, now_ns() - t0);
        if (stopping.load()) return -1;
        if (!slot.ready.empty()) {
          sample = std::move(slot.ready.front());
          slot.ready.pop_front();
          changed.notify_all();
          return 1;
        }
        if (slot.exhausted) return 0;
      }  // the tuner left the stage one worker while this waited: the coordinator reads on
    };
    auto fetch_loop = [&](int fetcher) {
      name_this_thread(st.spec->id + "+");
      std::unique_lock lock(mutex);
      for (;;) {
        ExpandSlot* work = nullptr;
        auto pick = [&] {
          if (quit || stopping.load()) return true;
          if (st.tuned_workers && (reading_alone() || fetcher >= st.active_workers.load(std::memory_order_relaxed))) return false;  // parked
          for (auto& s : slots)
            if (s.cursor && !s.busy && !s.exhausted && s.ready.size() < read_ahead) return (work = &s), true;
          return false;
        };
        while (!changed.wait_for(lock, std::chrono::milliseconds(50), pick)) {
        }
        if (!work) return;
        work->busy = true;
        lock.unlock();
        Sample sample;
        int got = 0;
        {
          CoreHold core(*this, st);
          std::uint64_t t0 = now_ns();
          try {
            got = !core.held() ? -1 : work->cursor->next(sample) ? 1 : 0;
            work->outputs_read += static_cast<std::uint64_t>(std::max(got, 0));
          } catch (const std::exception& e) {
            got = input_failure(*work, e.what()) ? 0 : -1;
          }
          add(st.counters.busy_ns, now_ns() - t0);
        }
        lock.lock();
        work->busy = false;
        if (got == 1) work->ready.push_back(std::move(sample));
        else work->exhausted = true;
        changed.notify_all();
      }
    };
    std::vector<std::thread> fetchers;
    // However this function leaves (an exception included), its fetchers are told and joined.
    struct JoinFetchers {
      std::function<void()> join;
      ~JoinFetchers() { join(); }
    } join_fetchers{[&] { stop_fetchers(fetchers); }};
    try {
      for (int i = 0; i < fetcher_count; ++i) fetchers.emplace_back(fetch_loop, i);
    } catch (const std::system_error& e) {
      throw Error(fmt::format("could not start reader thread {} of {}: {} (the process may be at its thread limit: lower "
                              "parallelism or cycle_length)",
                              fetchers.size() + 1, fetcher_count, e.what()));
    }

    auto emit = [&](Sample sample) {
      add(st.counters.elements_out, 1);
      add(st.counters.bytes_out, sample.nbytes());
      out.push_back(Item::element(std::move(sample)));
      if (out.size() < kChunk) return true;
      // Busy time is counted chunk by chunk, not only when new inputs are taken (one input file
      // may give records for seconds): the metrics and the autotuner see it as it happens.
      account_busy();
      reading_core.reset();  // no core held while waiting downstream
      return flush(st, out);
    };
    auto close = [&](ExpandSlot& slot) {
      release_owned(slot);
      std::unique_lock lock(mutex);
      while (!changed.wait_for(lock, std::chrono::milliseconds(50), [&] { return !slot.busy; })) {
      }
      slot.cursor.reset();
      slot.ready.clear();
      slot.exhausted = false;
    };
    bool ok = true;
    for (auto& slot : slots)
      if (!(ok = fill(slot))) break;
    std::size_t turn = 0;
    std::uint64_t last_flush = now_ns();
    while (ok && !stopping.load()) {
      bool any_open = false;
      for (auto& slot : slots) any_open |= static_cast<bool>(slot.cursor);
      if (!any_open) {
        if (!iteration_closed) {  // every input of this iteration failed to open, or was skipped
          for (auto& slot : slots)
            if (!(ok = fill(slot))) break;
          continue;
        }
        out.push_back(input_done ? Item::end_of_stream() : Item::end_of_iteration(epoch));
        if (!(ok = flush(st, out)) || input_done) break;
        ++epoch;
        index = 0;
        st.counters.epoch.store(epoch, std::memory_order_relaxed);
        iteration_closed = false;
        for (auto& slot : slots)
          if (!(ok = fill(slot))) break;
        turn = 0;
        continue;
      }
      if (!ordered && fetcher_count > 0) {
        // Completion order: the next slot in turn that has something ready.
        std::lock_guard lock(mutex);
        for (std::size_t k = 0; k < cycle; ++k) {
          auto& s = slots[(turn + k) % cycle];
          if (s.cursor && (!s.ready.empty() || s.exhausted)) {
            turn = (turn + k) % cycle;
            break;
          }
        }
      }
      ExpandSlot& slot = slots[turn];
      if (slot.cursor) {
        for (int taken = 0; taken < block; ++taken) {
          Sample sample;
          int got = take(slot, sample);
          if (got < 0) {
            ok = false;
            break;
          }
          if (got == 0) {
            close(slot);
            ok = fill(slot);
            break;
          }
          if (st.exit().output->skipped(slot.epoch)) {  // downstream wants no more of this epoch
            close(slot);
            ok = fill(slot);
            break;
          }
          if (!(ok = emit(std::move(sample)))) break;
        }
      }
      turn = (turn + 1) % cycle;
      // A waiting consumer gets what there is soon, but not record by record (each hand-off may
      // wake a thread).
      if (ok && !out.empty() && st.output->consumer_waiting() &&
          (out.size() >= kChunk / 4 || now_ns() - last_flush >= 50'000)) {
        ok = flush(st, out);
        last_flush = now_ns();
      }
    }
    account_busy();
    stop_fetchers(fetchers);
  }

  // Stateful transforms: one worker; iterations map to the input's through passes_per_iteration,
  // and iterations the input does not provide are replayed (cache).
  void run_aggregate(StageRuntime& st) {
    Aggregate& op = *st.aggregate;
    std::vector<Item> in, out;
    CollectingEmitter emitter(*this, st, out);
    std::uint64_t out_iteration = 0, in_iteration = 0, in_index = 0;
    std::int64_t inputs_in_group = 0;
    bool open = st.demand != 0;
    auto guarded = [&](auto&& call, const char* what) {
      try {
        call();
        return true;
      } catch (const std::exception& e) {
        fail(fmt::format("{} failed {} of epoch {}: {}", stage_label(st), what, st.first_output_epoch + out_iteration, e.what()), &st);
        return false;
      }
    };
    auto close_iteration = [&]() {
      if (!guarded([&] { op.end_iteration(st.first_output_epoch + out_iteration, emitter); }, "at the end")) return false;
      out.push_back(Item::end_of_iteration(out_iteration));
      if (!flush(st, out)) return false;
      ++out_iteration;
      st.counters.epoch.store(out_iteration, std::memory_order_relaxed);
      open = st.demand == kUnbounded || out_iteration < static_cast<std::uint64_t>(st.demand);
      emitter.iteration = out_iteration;
      return !open || guarded([&] { op.begin_iteration(st.first_output_epoch + out_iteration); }, "at the start");
    };
    if (open && !guarded([&] { op.begin_iteration(st.first_output_epoch); }, "at the start")) return;

    // Busy time is the time between two pops, less what flushing spent waiting downstream.
    std::uint64_t mark = now_ns(), blocked_at_mark = st.counters.blocked_ns.load();
    auto account_busy = [&](std::uint64_t now) {
      std::uint64_t blocked = st.counters.blocked_ns.load();
      std::uint64_t spent = now - mark, waited = blocked - blocked_at_mark;
      add(st.counters.busy_ns, spent > waited ? spent - waited : 0);
      blocked_at_mark = blocked;
    };
    for (;;) {
      std::uint64_t t0 = now_ns();
      account_busy(t0);
      if (!st.input->pop(in, kChunk)) return;
      mark = now_ns();
      add(st.counters.starved_ns, mark - t0);
      if (in.front().kind == Item::Kind::EndOfStream) break;
      if (in.front().kind == Item::Kind::EndOfIteration) {
        // Repeating forever over a pass that yielded nothing would spin without end: as in
        // tf.data, an empty pass ends the repetition.
        if (in_index == 0 && st.passes_per_iteration == kUnbounded) skip_input(st, kAllIterations);
        ++in_iteration;
        in_index = 0;
        ++inputs_in_group;
        if (open && st.passes_per_iteration > 0 && inputs_in_group == st.passes_per_iteration) {
          inputs_in_group = 0;
          if (!close_iteration()) return;
        }
        continue;
      }
      add(st.counters.elements_in, in.size());
      add(st.counters.bytes_in, bytes_of(in));
      for (auto& item : in) {
        ElementContext ctx{&st.info, st.first_input_epoch + in_iteration, in_index++};
        if (st.input->skipped(in_iteration) || !open) continue;
        const Origin origin = item.sample.shared_origin();
        try {
          if (op.push(std::move(item.sample), ctx, emitter) == Aggregate::Flow::SkipRestOfIteration)
            skip_input(st, static_cast<std::int64_t>(in_iteration));
        } catch (const std::exception& e) {
          if (!element_error(st, e.what(), ctx.epoch, ctx.index, origin.text())) return;
        }
        if (stopping.load(std::memory_order_relaxed)) return;
      }
      if (!flush(st, out)) return;
    }
    // The input ended: close a partly received group (repeat whose input was cut short), then
    // replay the iterations the input did not provide.
    if (open && (inputs_in_group > 0 || st.passes_per_iteration == kUnbounded) && !close_iteration()) return;
    while (open && !stopping.load() && st.output->skip_through.load() != kAllIterations) {
      bool replayed = false;
      if (!guarded([&] { replayed = op.replay(st.first_output_epoch + out_iteration, emitter); }, "replaying")) return;
      if (!replayed || !close_iteration()) break;
    }
    account_busy(now_ns());
    out.push_back(Item::end_of_stream());
    flush(st, out);
  }

  void worker(StageRuntime& st, int index) {
    name_this_thread(st.spec->id);
    try {
      if (st.source) run_source(st);
      else if (st.aggregate) run_aggregate(st);
      else if (st.expand) run_expand(st);
      else run_stateless(st, index);
    } catch (const std::bad_alloc&) {
      fail(out_of_memory_message(st), &st);
    } catch (const std::exception& e) {
      fail(fmt::format("{} stopped: {}", stage_label(st), e.what()), &st);
    } catch (...) {
      fail(fmt::format("{} stopped on an unknown exception", stage_label(st)), &st);
    }
    std::lock_guard lock(done_mutex);
    if (--live_workers == 0) {
      end_ns.store(now_ns());
      done_cv.notify_all();
    }
  }

  // After the last worker: join, finish every operator (sinks commit their files only when the
  // run completed), settle the state, publish the final snapshot.
  void finalize() {
    for (auto& t : threads) t.join();
    threads.clear();
    bool complete = sinks_done.load() == sink_count && !failed;
    for (auto& st : stages) {
      if (!st->started) continue;
      try {
        st->op->finish(complete);
      } catch (const std::exception& e) {
        if (complete) fail(fmt::format("{} could not finish: {}", stage_label(*st), e.what()), st.get());
        complete = false;
      }
      st->started = false;
    }
    state.store(static_cast<int>(failed ? RunState::Failed : complete ? RunState::Finished : RunState::Stopped));
    {
      std::lock_guard lock(publish_mutex);
      publisher_quit = true;
      publish_cv.notify_all();
    }
    if (publisher.joinable()) publisher.join();
    if (tuner.joinable()) tuner.join();
    publish(make_snapshot());
  }

  // ---- metrics ----

  metrics::MetricsSnapshot make_snapshot() const {
    std::lock_guard lock(snapshot_mutex);
    metrics::MetricsSnapshot snap;
    const std::uint64_t now = end_ns.load() ? end_ns.load() : now_ns();
    const double elapsed_ns = start_ns ? static_cast<double>(now - start_ns) : 0.0;
    snap.set_sequence(++sequence);
    snap.set_elapsed_s(elapsed_ns / 1e9);
    snap.set_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
    snap.set_state(run_state_name(static_cast<RunState>(state.load())));
    {
      std::lock_guard lock(error_mutex);
      if (failed) {
        snap.set_error(error);
        snap.set_failed_stage(failed_stage);
      }
    }
    snap.set_cores(std::thread::hardware_concurrency());
    {
      auto* w = snap.mutable_worker();
      w->set_index(graph.worker.index);
      w->set_count(graph.worker.count);
      w->set_source(graph.worker.origin());
      for (const auto& note : graph.worker_notes) w->add_notes(note);
    }
    for (const auto& st_ptr : stages) {
      auto& st = *st_ptr;
      auto* m = snap.add_stage();
      m->set_id(st.spec->id);
      m->set_op(st.spec->op->info.name);
      m->set_kind(operator_kind_name(st.spec->op->info.kind));
      // A fused member runs in its head's workers.
      StageRuntime& runner = st.fused_head ? *st.fused_head : st;
      m->set_workers(static_cast<std::uint32_t>(runner.running_workers()));
      if (runner.tuned_workers) {
        m->set_workers_tuned(true);
        m->set_max_workers(static_cast<std::uint32_t>(runner.workers));
      }
      m->set_buffer_tuned(st.tuned_buffer);
      for (int in : st.spec->inputs) m->add_inputs(graph.stages[in].id);
      const auto& c = st.counters;
      std::uint64_t el_out = c.elements_out.load(), by_out = c.bytes_out.load(), el_in = c.elements_in.load();
      m->set_elements_in(el_in);
      m->set_elements_out(el_out);
      m->set_bytes_in(c.bytes_in.load());
      m->set_bytes_out(by_out);
      const double capacity_ns = start_ns ? runner.worker_capacity_ns(now, start_ns) : 0.0;
      if (capacity_ns > 0) {
        m->set_busy_fraction(std::min(1.0, c.busy_ns.load() / capacity_ns));
        m->set_starved_fraction(std::min(1.0, c.starved_ns.load() / capacity_ns));
        m->set_blocked_fraction(std::min(1.0, c.blocked_ns.load() / capacity_ns));
        m->set_elements_per_s(el_out / (elapsed_ns / 1e9));
        m->set_bytes_per_s(by_out / (elapsed_ns / 1e9));
      }
      std::uint64_t counted = st.source ? el_out : el_in;
      if (counted) m->set_mean_element_us(c.busy_ns.load() / 1e3 / static_cast<double>(counted));
      if (st.fused_head) m->set_fused_with(st.fused_head->spec->id);
      if (st.output) {
        m->set_buffer_level(static_cast<std::uint32_t>(st.output->level()));
        m->set_buffer_capacity(static_cast<std::uint32_t>(st.output->capacity()));
        m->set_buffer_bytes(st.output->level_bytes());
        m->set_buffer_byte_limit(st.output->byte_limit());
        m->set_mean_buffer_fill(st.output->mean_fill());
        auto [empty, full] = st.output->empty_and_full_fractions();
        m->set_buffer_empty_fraction(empty);
        m->set_buffer_full_fraction(full);
        m->set_buffer_swings(st.output->swings());
      }
      m->set_stateless(st.spec->op->info.traits.stateless);
      m->set_random(st.spec->op->info.traits.random);
      m->set_expected_elements(st.expected_elements.load(std::memory_order_relaxed));
      m->set_errors_skipped(c.errors_skipped.load());
      {
        std::lock_guard rl(st.reasons_mutex);
        for (const auto& r : st.skip_reasons) m->add_skip_reasons(r);
        for (const auto& [kind, count] : st.skip_reason_counts) (*m->mutable_skip_reason_counts())[kind] = count;
      }
      m->set_epoch(c.epoch.load());
      if (st.previous_ns && now > st.previous_ns) {
        double dt = (now - st.previous_ns) / 1e9;
        m->set_recent_elements_per_s((el_out - st.previous_elements) / dt);
        m->set_recent_bytes_per_s((by_out - st.previous_bytes) / dt);
      } else {
        m->set_recent_elements_per_s(m->elements_per_s());
        m->set_recent_bytes_per_s(m->bytes_per_s());
      }
      if (st.sink) {
        auto devices = st.sink->device_counters();
        st.previous_device_bytes.resize(devices.size(), 0);
        for (std::size_t d = 0; d < devices.size(); ++d) {
          auto* dm = m->add_devices();
          dm->set_name(devices[d].name);
          dm->set_bytes(devices[d].bytes);
          dm->set_slices(devices[d].slices);
          dm->set_ring_level(devices[d].ring_level);
          dm->set_ring_capacity(devices[d].ring_capacity);
          dm->set_checked_slices(devices[d].checked);
          if (elapsed_ns > 0) dm->set_bytes_per_s(devices[d].bytes / (elapsed_ns / 1e9));
          if (st.previous_ns && now > st.previous_ns)
            dm->set_recent_bytes_per_s((devices[d].bytes - st.previous_device_bytes[d]) / ((now - st.previous_ns) / 1e9));
          else
            dm->set_recent_bytes_per_s(dm->bytes_per_s());
          st.previous_device_bytes[d] = devices[d].bytes;
        }
      }
      st.previous_ns = now;
      st.previous_elements = el_out;
      st.previous_bytes = by_out;
    }
    if (autotune) {
      auto* a = snap.mutable_autotune();
      a->set_cpu_budget(cpu_budget);
      a->set_cpu_budget_source(cpu_budget_source);
      a->set_ram_budget(ram_budget);
      a->set_ram_budget_source(ram_budget_source);
      a->set_buffer_budget(buffer_budget);
      std::lock_guard lock(tune_mutex);
      for (const auto& change : tune_changes) *a->add_changes() = change;
      a->set_changes_left_out(tune_changes_left_out);
    }
    Bottleneck b = find_bottleneck(snap);
    if (b.stage >= 0) {
      snap.set_bottleneck(snap.stage(b.stage).id());
      snap.set_bottleneck_reason(b.reason);
    }
    return snap;
  }

  void publish(const metrics::MetricsSnapshot& snap) {
    for (auto& subscriber : subscribers) {
      try {
        subscriber(snap);
      } catch (...) {
        // An observer's failure must never disturb the run.
      }
    }
  }

  // ---- autotune ----

  // The budgets (the pipeline's, else what the process may use) and the most workers each tuned
  // stage may get: every core of the budget, and for an expand stage no more than its open inputs.
  void set_autotune_budgets() {
    autotune = true;
    if (graph.cpu_budget > 0) {
      cpu_budget = graph.cpu_budget;
      cpu_budget_source = "options.autotune.cpu_budget";
    } else {
      const UsableCores cores = usable_cores();
      cpu_budget = cores.cores;
      cpu_budget_source = cores.why;
    }
    if (graph.ram_budget > 0) {
      ram_budget = graph.ram_budget;
      ram_budget_source = "options.autotune.ram_budget";
    } else {
      const UsableMemory memory = usable_memory();
      ram_budget = memory.bytes / 2;
      ram_budget_source = "half of " + memory.why;
    }
    // The buffers hold at most half of it together; the rest is for the elements in the workers'
    // hands, the operators' own state (shuffle buffers, batches being filled) and the pools.
    buffer_budget = ram_budget / 2;
    cores_total = std::max(1, static_cast<int>(std::floor(cpu_budget)));
    const int most = std::clamp(static_cast<int>(std::ceil(cpu_budget)), 1, 1024);
    for (std::size_t i = 0; i < stages.size(); ++i) {
      auto& st = *stages[i];
      if (!graph.stages[i].autotune_workers || st.source || st.aggregate) continue;
      st.tuned_workers = true;
      st.workers = st.expand ? std::min(most, std::max(1, graph.stages[i].cycle_length)) : most;
      st.active_workers.store(1);
    }
  }


  static constexpr auto kTuneWindow = std::chrono::milliseconds(250);
  static constexpr std::size_t kKeptTuneChanges = 500;

  // Every window: what each stage (a fused group as one) did, the tuner's plan, applied at once.
  void run_tuner() {
    name_this_thread("autotune");
    detail::Autotuner planner({cpu_budget, buffer_budget});
    std::vector<StageRuntime*> runners;
    for (auto& st : stages)
      if (!st->fused_head) runners.push_back(st.get());
    struct Reading {
      std::uint64_t busy_ns = 0, elements_out = 0, bytes_out = 0;
      Channel::Extremes extremes;
    };
    auto read = [&](StageRuntime& runner) {
      Reading r;
      r.busy_ns = runner.counters.busy_ns.load();
      for (auto* member : runner.fused) r.busy_ns += member->counters.busy_ns.load();
      StageRuntime& exit = runner.exit();
      r.elements_out = exit.counters.elements_out.load();
      r.bytes_out = exit.counters.bytes_out.load();
      if (exit.output) r.extremes = exit.output->extremes();
      return r;
    };
    std::vector<Reading> previous;
    for (auto* runner : runners) previous.push_back(read(*runner));
    std::vector<std::uint64_t> element_bytes(runners.size(), 0);
    // What reaches the pipeline's end, for checking that a change helped.
    StageRuntime& last = *stages.back();
    std::uint64_t previous_reached = last.counters.elements_in.load();
    std::uint64_t previous_ns = now_ns();
    std::unique_lock lock(publish_mutex);
    while (!publisher_quit) {
      publish_cv.wait_for(lock, kTuneWindow, [&] { return publisher_quit; });
      if (publisher_quit || stopping.load()) break;
      lock.unlock();
      const std::uint64_t now = now_ns();
      const double window_ns = static_cast<double>(now - previous_ns);
      std::vector<detail::TunedStage> view;
      for (std::size_t i = 0; i < runners.size(); ++i) {
        StageRuntime& runner = *runners[i];
        StageRuntime& exit = runner.exit();
        const Reading r = read(runner);
        const Reading& before = previous[i];
        detail::TunedStage t;
        t.id = runner.spec->id;
        t.tunes_workers = runner.tuned_workers;
        t.workers = runner.running_workers();
        t.max_workers = runner.workers;
        t.busy_cores = static_cast<double>(r.busy_ns - before.busy_ns) / window_ns;
        if (exit.output) {
          t.has_buffer = true;
          t.tunes_buffer = exit.tuned_buffer;
          t.capacity = exit.output->capacity();
          t.byte_limit = exit.output->byte_limit();
          t.empty_fraction = static_cast<double>(r.extremes.empty_ns - before.extremes.empty_ns) / window_ns;
          t.full_fraction = static_cast<double>(r.extremes.full_ns - before.extremes.full_ns) / window_ns;
          t.swings = r.extremes.swings - before.extremes.swings;
          if (r.elements_out > before.elements_out)
            element_bytes[i] = (r.bytes_out - before.bytes_out) / (r.elements_out - before.elements_out);
          t.mean_element_bytes = element_bytes[i];
        }
        previous[i] = r;
        view.push_back(std::move(t));
      }
      const std::uint64_t reached = last.counters.elements_in.load();
      const double output_rate = static_cast<double>(reached - previous_reached) / (window_ns / 1e9);
      previous_reached = reached;
      previous_ns = now;
      for (const auto& change : planner.plan(view, output_rate)) apply_tune_change(*runners[static_cast<std::size_t>(change.stage)], change, now);
      set_cores_for_tuned(planner.cores_for_tuned());
      lock.lock();
    }
  }

  void apply_tune_change(StageRuntime& runner, const detail::TuneChange& change, std::uint64_t now) {
    if (change.buffer) runner.exit().output->resize(static_cast<std::size_t>(change.to), change.byte_limit);
    else runner.set_active_workers(static_cast<int>(change.to), now, start_ns);
    metrics::AutotuneChange record;
    record.set_at_s(static_cast<double>(now - start_ns) / 1e9);
    record.set_stage(change.buffer ? runner.exit().spec->id : runner.spec->id);
    record.set_what(change.buffer ? "buffer" : "workers");
    record.set_from(change.from);
    record.set_to(change.to);
    record.set_byte_limit(change.byte_limit);
    record.set_reason(change.reason);
    std::lock_guard lock(tune_mutex);
    if (tune_changes.size() < kKeptTuneChanges) tune_changes.push_back(std::move(record));
    else ++tune_changes_left_out;
  }

  void run_publisher() {
    name_this_thread("metrics");
    std::unique_lock lock(publish_mutex);
    while (!publisher_quit) {
      publish_cv.wait_for(lock, options.snapshot_interval, [&] { return publisher_quit; });
      if (publisher_quit) break;
      lock.unlock();
      publish(make_snapshot());
      lock.lock();
    }
  }
};

namespace {

// What a stage's output is made of (see StageInfo::input_fingerprint): its operator and
// parameters; its id and the seed when it draws random numbers (they key every draw); its inputs.
std::uint64_t stage_output_fingerprint(const GraphStage& spec, std::uint64_t seed, std::uint64_t input_fingerprint) {
  std::string text = spec.op->info.name;
  for (const auto& [name, value] : spec.params.values()) text += '\n' + name + '=' + format_param(value);
  if (spec.op->info.traits.random) text += fmt::format("\nid={}\nseed={}", spec.id, seed);
  return mix64(stable_hash(text) ^ input_fingerprint);
}

// The epoch of the first input pass of an aggregate whose output starts at `output_epoch`, reading
// `passes` input passes per output iteration. A repeat forever reads without end in one output
// iteration: a later run's input starts 2^20 epochs further on, so that no run draws an earlier
// run's shuffles (the random generators key 32 bits of the epoch: 4,096 such runs before any repeat).
std::uint64_t input_epoch_of(std::uint64_t output_epoch, std::int64_t passes) {
  if (passes == kUnbounded) return output_epoch << 20;
  return passes > 0 ? output_epoch * static_cast<std::uint64_t>(passes) : output_epoch;
}

}  // namespace

Engine::Engine(Graph graph, EngineOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->graph = std::move(graph);
  impl_->options = options;
  auto& g = impl_->graph;
  std::vector<std::uint64_t> output_fingerprints;
  for (std::size_t i = 0; i < g.stages.size(); ++i) {
    const GraphStage& spec = g.stages[i];
    auto st = std::make_unique<StageRuntime>();
    st->spec = &spec;
    st->registered = spec.op;
    const auto& info = spec.op->info;
    try {
      st->op = info.create(spec.params);
    } catch (const std::exception& e) {
      throw Error(fmt::format("stage '{}': operator '{}' (from {}) could not be created: {}", spec.id, info.name,
                              spec.op->library_path, e.what()));
    }
    if (!st->op) throw Error(fmt::format("stage '{}': operator '{}' (from {}) created nothing", spec.id, info.name, spec.op->library_path));
    Operator* op = st->op.get();
    switch (info.kind) {
      case OperatorKind::Source: st->source = dynamic_cast<Source*>(op); break;
      case OperatorKind::Map: st->map = dynamic_cast<Map*>(op); break;
      case OperatorKind::Filter: st->filter = dynamic_cast<Filter*>(op); break;
      case OperatorKind::Expand: st->expand = dynamic_cast<Expand*>(op); break;
      case OperatorKind::Aggregate: st->aggregate = dynamic_cast<Aggregate*>(op); break;
      case OperatorKind::Sink: st->sink = dynamic_cast<Sink*>(op); break;
    }
    if (!st->source && !st->map && !st->filter && !st->expand && !st->aggregate && !st->sink)
      throw Error(fmt::format("stage '{}': operator '{}' (from {}) declares kind {} but does not implement it", spec.id,
                              info.name, spec.op->library_path, operator_kind_name(info.kind)));
    st->info.id = spec.id;
    st->info.seed = g.seed;
    st->info.stage_hash = stable_hash(spec.id);
    std::uint64_t input_fingerprint = stable_hash("inputs");
    for (int input : spec.inputs) input_fingerprint = mix64(input_fingerprint ^ output_fingerprints[static_cast<std::size_t>(input)]);
    st->info.input_fingerprint = input_fingerprint;
    output_fingerprints.push_back(stage_output_fingerprint(spec, g.seed, input_fingerprint));
    st->workers = (st->source || st->aggregate) ? 1 : spec.parallelism;
    st->tuned_buffer = spec.autotune_buffer;
    if (st->sink) ++impl_->sink_count;
    impl_->stages.push_back(std::move(st));
  }
  if (g.autotunes()) impl_->set_autotune_budgets();
}

Engine::~Engine() {
  stop();
  if (impl_->state.load() != static_cast<int>(RunState::Created)) wait();
}

void Engine::subscribe(std::function<void(const metrics::MetricsSnapshot&)> callback) {
  impl_->subscribers.push_back(std::move(callback));
}

const Graph& Engine::graph() const { return impl_->graph; }

void Engine::start() {
  auto& I = *impl_;
  if (I.state.load() != static_cast<int>(RunState::Created)) throw Error("the engine was already started");
  // Downstream first, so that memory a stage offers (a GPU feed's pinned pool) reaches the
  // stages before it, through those that keep shapes, to the one that builds the elements.
  for (int i = static_cast<int>(I.stages.size()) - 1; i >= 0; --i) {
    auto& st = I.stages[i];
    try {
      st->op->start(st->info);
      st->started = true;
      Placement* placement = I.graph.deterministic ? st->op->offered_placement() : nullptr;
      if (placement && !st->spec->inputs.empty() && I.stages[st->spec->inputs[0]]->map)
        I.stages[st->spec->inputs[0]]->info.placement = placement;
      if (Allocator* offered = st->op->offered_allocator()) {
        for (int up = st->spec->inputs.empty() ? -1 : st->spec->inputs[0]; up >= 0;) {
          auto& producer = *I.stages[up];
          producer.info.allocator = offered;
          if (!producer.spec->op->info.traits.keeps_shape || producer.spec->inputs.empty()) break;
          up = producer.spec->inputs[0];
        }
      }
    } catch (const std::exception& e) {
      for (auto& other : I.stages)
        if (other->started) {
          try {
            other->op->finish(false);
          } catch (...) {
          }
          other->started = false;
        }
      throw Error(fmt::format("stage '{}' ({}) could not start: {}", st->spec->id, st->spec->op->info.name, e.what()));
    }
  }
  // Iterations: each sink reads one iteration of its input; going upstream, a repeat multiplies
  // the passes it needs and a filled cache needs none. Epochs scale the same way.
  for (int i = static_cast<int>(I.stages.size()) - 1; i >= 0; --i) {
    auto& st = *I.stages[i];
    const int consumer = st.spec->consumer;
    if (consumer >= 0) {
      auto& c = *I.stages[consumer];
      st.demand = c.aggregate ? c.aggregate->input_passes(c.demand) : c.demand;
      st.first_output_epoch = c.first_input_epoch;
    } else {
      st.first_output_epoch = I.options.first_epoch;
    }
    st.first_input_epoch = st.first_output_epoch;
    if (st.source) {  // started above: a source knows its size now, if it can
      const std::int64_t per_pass = st.source->expected_elements();
      if (per_pass >= 0 && st.demand != kUnbounded) st.expected_elements.store(per_pass * st.demand);
    }
    if (st.aggregate) {
      st.passes_per_iteration = st.aggregate->input_passes(1);
      st.keeps_reading = st.aggregate->keeps_reading_when_skipped();
      st.first_input_epoch = input_epoch_of(st.first_output_epoch, st.passes_per_iteration);
    }
  }
  // Fuse a stateless map with the stateless map or filter that reads it, when they run on as many
  // workers and the map asks for no buffer of its own (prefetch does, and an explicit buffer_size).
  if (I.graph.fuse) {
    for (auto& st_ptr : I.stages) {
      auto& st = *st_ptr;
      if (!st.map || st.spec->consumer < 0 || st.spec->buffer_size > 0 || st.tuned_buffer || st.op->preferred_buffer() > 0) continue;
      if (!st.spec->op->info.traits.stateless) continue;
      auto& next = *I.stages[st.spec->consumer];
      if (!(next.map || next.filter) || !next.spec->op->info.traits.stateless || next.workers != st.workers ||
          next.tuned_workers != st.tuned_workers)
        continue;
      StageRuntime& head = st.fused_head ? *st.fused_head : st;
      head.fused.push_back(&next);
      next.fused_head = &head;
    }
  }
  for (int i = static_cast<int>(I.stages.size()) - 1; i >= 0; --i) {
    auto& st = *I.stages[i];
    const bool feeds_own_group = st.spec->consumer >= 0 && I.stages[st.spec->consumer]->fused_head &&
                                 (I.stages[st.spec->consumer]->fused_head == &st || I.stages[st.spec->consumer]->fused_head == st.fused_head);
    if (!st.sink && !feeds_own_group) {
      std::size_t capacity = st.spec->buffer_size > 0 ? static_cast<std::size_t>(st.spec->buffer_size) : st.op->preferred_buffer();
      std::uint64_t byte_limit = 0;
      if (capacity == 0 || st.tuned_buffer) {
        capacity = I.options.default_buffer;
        byte_limit = I.options.default_buffer_bytes;
      }
      st.output = std::make_unique<Channel>(capacity, byte_limit, I.stopping);
    }
  }
  // Under autotune every buffer, an explicit one too, holds at most its share of the buffers'
  // part of the RAM budget; the tuner moves memory to the buffers that need it.
  if (I.autotune) {
    std::size_t buffers = 0;
    for (auto& st : I.stages) buffers += st->output ? 1 : 0;
    const std::uint64_t share = buffers > 0 ? std::max<std::uint64_t>(1, I.buffer_budget / buffers) : 0;
    for (auto& st : I.stages)
      if (st->output) {
        const std::uint64_t limit = st->output->byte_limit();
        st->output->resize(st->output->capacity(), limit == 0 ? share : std::min(limit, share));
      }
  }
  for (auto& st : I.stages) {
    if (!st->spec->inputs.empty() && !st->fused_head) {
      st->input_stage = st->spec->inputs[0];
      st->input = I.stages[st->input_stage]->output.get();
    }
  }
  I.start_ns = now_ns();
  I.state.store(static_cast<int>(RunState::Running));
  int planned_workers = 0;
  for (auto& st : I.stages)
    if (!st->fused_head) planned_workers += st->threads();
  {
    std::lock_guard lock(I.done_mutex);
    I.live_workers += planned_workers;
  }
  // A thread that cannot be created (a process or cgroup thread limit) ends the run with the
  // stage named; the workers it would have run are no longer waited for.
  bool thread_failed = false;
  for (auto& st : I.stages) {
    for (int w = 0; w < st->threads() && !st->fused_head && !thread_failed; ++w) {
      try {
        I.threads.emplace_back([&I, s = st.get(), w] { I.worker(*s, w); });
      } catch (const std::system_error& e) {
        I.fail(fmt::format("{} could not start worker {} of {}: {} (the process may be at its thread limit: lower "
                           "parallelism or cycle_length, or raise `ulimit -u`)",
                           I.stage_label(*st), w + 1, st->threads(), e.what()),
               st.get());
        thread_failed = true;
      }
    }
    if (thread_failed) break;
  }
  if (thread_failed) {
    std::lock_guard lock(I.done_mutex);
    I.live_workers -= planned_workers - static_cast<int>(I.threads.size());
    if (I.live_workers == 0) {
      I.end_ns.store(now_ns());
      I.done_cv.notify_all();
    }
  }
  try {
    if (I.autotune) I.tuner = std::thread([&I] { I.run_tuner(); });
    I.publisher = std::thread([&I] { I.run_publisher(); });
  } catch (const std::system_error& e) {
    I.fail(fmt::format("the metrics thread could not start: {} (the process may be at its thread limit)", e.what()));
  }
}

void Engine::stop() { impl_->request_stop(); }

bool Engine::wait_for(std::chrono::milliseconds timeout) {
  auto& I = *impl_;
  if (I.state.load() == static_cast<int>(RunState::Created)) return true;
  std::unique_lock lock(I.done_mutex);
  return I.done_cv.wait_for(lock, timeout, [&] { return I.live_workers == 0; });
}

RunResult Engine::wait() {
  auto& I = *impl_;
  if (I.state.load() == static_cast<int>(RunState::Created)) return {RunState::Created, ""};
  {
    std::unique_lock lock(I.done_mutex);
    I.done_cv.wait(lock, [&] { return I.live_workers == 0; });
  }
  std::call_once(I.finalized, [&I] { I.finalize(); });
  std::lock_guard lock(I.error_mutex);
  return {static_cast<RunState>(I.state.load()), I.error, I.failed_stage};
}

RunState Engine::state() const { return static_cast<RunState>(impl_->state.load()); }

metrics::MetricsSnapshot Engine::snapshot() const { return impl_->make_snapshot(); }

Feed* Engine::feed(const std::string& stage_id) const {
  for (auto& st : impl_->stages)
    if (st->spec->id == stage_id) {
      Feed* f = st->sink ? st->sink->feed() : nullptr;
      if (!f) throw Error(fmt::format("stage '{}' ({}) is not a feed sink: only a sink such as gpu_feed hands batches to the application",
                                      stage_id, st->spec->op->info.name));
      return f;
    }
  throw Error(fmt::format("the pipeline has no stage '{}'", stage_id));
}

}  // namespace sluice
