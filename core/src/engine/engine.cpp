// The engine's public face and its control: creating and starting stages, wiring channels,
// demand and epochs, fusion, threads; stopping, failures and skip reasons; the end of a run.
#include "engine_impl.hpp"

#include <cxxabi.h>

#include <exception>
#include <system_error>

#include <pthread.h>

#include "sluice/core/param_parse.hpp"
#include "sluice/core/text.hpp"

namespace sluice {

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

}  // namespace

void name_this_thread(const std::string& name) {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
#else
  (void)name;
#endif
}

void Engine::Impl::set_cores_for_tuned(int count) {
  {
    std::lock_guard lock(cores_mutex);
    cores_total = std::max(1, count);
  }
  cores_cv.notify_all();
}

void Engine::Impl::request_stop() {
  stopping.store(true);
  // Remote listings and reads end at once, inside start() too (list_files lists there); not a
  // sink's: what it does remotely publishes its outputs, which must end whole.
  for (auto& st : stages)
    if (!st->sink) st->remote_storage.cancel();
  // Until the workers run, start() is still making the buffers (on its own thread): nothing
  // waits on them yet, and the workers see `stopping` when they begin.
  if (state.load() == static_cast<int>(RunState::Created)) return;
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

void Engine::Impl::fail(const std::string& message, const StageRuntime* at) {
  if (stopped_remote_work(at)) return;
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

std::string Engine::Impl::stage_label(const StageRuntime& st) const {
  return fmt::format("stage '{}' ({})", st.spec->id, st.spec->op->info.name);
}

// Whether an error of stage `at` is its remote work ending because the run was asked to stop
// (RequestCounters::cancelled): the stop's own doing, neither a failure nor a skipped element.
bool Engine::Impl::stopped_remote_work(const StageRuntime* at) const {
  if (!at || !at->remote_storage.cancelled() || !stopping.load()) return false;
  std::lock_guard lock(error_mutex);
  return !failed;
}

bool Engine::Impl::element_error(StageRuntime& st, const char* what, std::uint64_t epoch, std::uint64_t index, const std::string& origin, ChunkIssues* deferred) {
  if (stopped_remote_work(&st)) return false;
  if (handling_out_of_memory()) {
    fail_or_defer(st, out_of_memory_message(st), deferred);
    return false;
  }
  std::string where = fmt::format("element {} of epoch {}{}", index, epoch, origin.empty() ? "" : " from " + origin);
  // A parameter that does not fit the data (ParamError while running) is no element's fault:
  // skipping would drop every element, so it ends the run whatever the policy, naming the fix.
  if (current_exception_is<ParamError>()) {
    fail_or_defer(st, fmt::format("{} cannot go on at {}: {}\n  (fix the parameter: `sluice plugins {}` says what each means)", stage_label(st),
                                  where, what, st.spec->op->info.name),
                  deferred);
    return false;
  }
  if (current_exception_is<StageFailure>()) {
    fail_or_defer(st, fmt::format("{} failed after {}: {}", stage_label(st), where, what), deferred);
    return false;
  }
  if (st.spec->error_policy == ErrorPolicyKind::Skip) {
    add(st.counters.errors_skipped, 1);
    if (deferred) deferred->skip_reasons.emplace_back(&st, where + ": " + what);
    else keep_skip_reason(st, where + ": " + what);
    return true;
  }
  std::string message = fmt::format("{} failed on {}: {}\n  ({})", stage_label(st), where, what, failure_advice(st));
  fail_or_defer(st, std::move(message), deferred);
  return false;
}

std::string Engine::Impl::failure_advice(const StageRuntime& st) const {
  if (current_exception_is<SchemaMismatch>() && st.counters.elements_out.load() == 0)
    return "no element has passed this stage yet: its parameters likely do not fit the data, and skipping would drop every "
           "element; fix the parameters (`sluice plugins " + st.spec->op->info.name + "` says what each means)";
  return "set `error_policy: skip` on this stage to drop such elements and go on";
}

void Engine::Impl::fail_or_defer(StageRuntime& st, std::string message, ChunkIssues* deferred) {
  if (deferred) {
    deferred->failure = std::move(message);
    deferred->failed_stage = &st;
  } else {
    fail(message, &st);
  }
}

std::string Engine::Impl::out_of_memory_message(const StageRuntime& st) const {
  std::string message = fmt::format("{} ran out of memory: the process could not get the memory it asked for", stage_label(st));
  if (std::string holder = largest_holder(); !holder.empty()) return message + "; " + holder + "; no element is at fault";
  return message + " (lower buffer_size, batch_size, parallelism or cycle_length, or give the process more memory); no element is at fault";
}

// The stage holding the most memory in elements it took and has not handed on, when that is most
// of what the run holds: the stage that failed to allocate is often only the next to ask (a
// source decoding images while a shuffle of a billion holds the memory), and its own parameters
// are not the ones to change.
std::string Engine::Impl::largest_holder() const {
  const StageRuntime* largest = nullptr;
  std::uint64_t largest_bytes = 0, all = 0;
  for (const auto& stage : stages) {
    const std::uint64_t in = stage->counters.bytes_in.load(), out = stage->counters.bytes_out.load();
    // A cache kept in memory gives on what it records, and holds all of it.
    const bool caches_in_memory = stage->spec->op->info.traits.role == OperatorRole::Caches && stage->spec->params.has("path") &&
                                  stage->spec->params.get_string("path").empty();
    const std::uint64_t held = caches_in_memory ? in : stage->aggregate && in > out ? in - out : 0;
    all += held;
    if (held > largest_bytes) {
      largest_bytes = held;
      largest = stage.get();
    }
  }
  if (!largest || largest_bytes < (64u << 20) || largest_bytes * 2 < all) return {};
  const bool cache = largest->spec->op->info.traits.role == OperatorRole::Caches;
  return fmt::format("{} holds {} of the elements it took{}", stage_label(*largest), byte_size_text(largest_bytes),
                     cache ? " (a cache with no path keeps its first iteration in memory: give it a path to keep it in a file)"
                           : " (lower its buffer_size, or what makes it hold elements)");
}

void Engine::Impl::keep_skip_reason(StageRuntime& st, std::string reason) {
  std::string kind = reason_kind(reason);
  std::lock_guard lock(st.reasons_mutex);
  if (auto it = st.skip_reason_counts.find(kind); it != st.skip_reason_counts.end()) ++it->second;
  else st.skip_reason_counts.emplace(st.skip_reason_counts.size() < kMaxReasonKinds ? std::move(kind) : "(other reasons)", 1);
  if (st.skip_reasons.size() < options.kept_skip_reasons) st.skip_reasons.push_back(std::move(reason));
}

void Engine::Impl::report_issues(ChunkIssues& issues) {
  for (auto& [stage, reason] : issues.skip_reasons) keep_skip_reason(*stage, std::move(reason));
  if (!issues.failure.empty()) fail(issues.failure, issues.failed_stage);
}

void Engine::Impl::skip_input(StageRuntime& st, std::int64_t iteration, int only_input) {
  if (st.fused_head) {
    skip_input(*st.fused_head, iteration);
    return;
  }
  for (std::size_t k = 0; k < st.inputs.size(); ++k) {
    if (only_input >= 0 && static_cast<int>(k) != only_input) continue;
    Channel& input = *st.inputs[k];
    if (input.skip_through.load() >= iteration) continue;
    input.request_skip(iteration);
    skip_upstream_of(*stages[st.input_stages[k]]);
  }
}

void Engine::Impl::skip_upstream_of(StageRuntime& producer) {
  if (producer.source) return;  // a source watches its output channels
  const std::int64_t iteration = producer.output->skip_through();  // what none of its readers wants
  if (iteration < 0) return;
  if (!producer.aggregate) {  // maps, filters, expands, combines: an iteration is their inputs'
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

bool Engine::Impl::flush(StageRuntime& st, std::vector<Item>& out) {
  if (out.empty()) return !stopping.load(std::memory_order_relaxed);
  StageRuntime& exit = st.exit();
  exit.observe_output(out);
  std::uint64_t t0 = now_ns();
  bool ok = exit.output->push(out);
  add(exit.counters.blocked_ns, now_ns() - t0);
  return ok;
}

void Engine::Impl::worker(StageRuntime& st, int index) {
  name_this_thread(st.spec->id);
  try {
    if (st.source) run_source(st);
    else if (st.aggregate) run_aggregate(st);
    else if (st.expand) run_expand(st);
    else if (st.combine) run_combine(st);
    else run_stateless(st, index);
  } catch (abi::__forced_unwind&) {
    // The thread is being ended from inside a call (an interpreter at exit ends a thread that
    // waits for its lock): that unwinding must go on, or the process aborts.
    throw;
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

void Engine::Impl::finalize() {
  for (auto& t : threads) t.join();
  threads.clear();
  // A run stopped at a checkpoint is complete up to it: its sinks keep what they wrote.
  bool complete = (sinks_done.load() == sink_count || stopped_at_checkpoint.load()) && !failed;
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
  state.store(static_cast<int>(failed ? RunState::Failed : complete && !stopped_at_checkpoint.load() ? RunState::Finished : RunState::Stopped));
  {
    std::lock_guard lock(publish_mutex);
    publisher_quit = true;
    publish_cv.notify_all();
  }
  if (publisher.joinable()) publisher.join();
  if (tuner.joinable()) tuner.join();
  publish(make_snapshot());
}


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
      case OperatorKind::Combine: st->combine = dynamic_cast<Combine*>(op); break;
    }
    if (!st->source && !st->map && !st->filter && !st->expand && !st->aggregate && !st->sink && !st->combine)
      throw Error(fmt::format("stage '{}': operator '{}' (from {}) declares kind {} but does not implement it", spec.id,
                              info.name, spec.op->library_path, operator_kind_name(info.kind)));
    st->info.id = spec.id;
    st->info.seed = g.seed;
    st->info.stage_hash = stable_hash(spec.id);
    for (int input : spec.inputs) st->info.input_ids.push_back(g.stages[static_cast<std::size_t>(input)].id);
    std::uint64_t input_fingerprint = stable_hash("inputs");
    for (int input : spec.inputs) input_fingerprint = mix64(input_fingerprint ^ output_fingerprints[static_cast<std::size_t>(input)]);
    st->info.input_fingerprint = input_fingerprint;
    st->info.counters = &st->operator_counters;
    st->operator_counters.lineage = options.lineage;
    st->operator_counters.skipped = [impl = impl_.get(), stage = st.get()](std::uint64_t count, const std::vector<std::string>& reasons) {
      add(stage->counters.errors_skipped, count);
      for (const auto& reason : reasons) impl->keep_skip_reason(*stage, reason);
    };
    st->remote_storage.set_options(g.remote);
    st->info.storage = &st->remote_storage;
    output_fingerprints.push_back(stage_output_fingerprint(spec, g.seed, input_fingerprint));
    st->output_fingerprint = output_fingerprints.back();
    // An aggregate's parallelism is its assembly threads, where the operator assembles in parallel
    // (validation refused it for the others).
    st->assembles_in_parallel = st->aggregate && dynamic_cast<AssemblesInParallel*>(op);
    st->workers = stage_threads(info, *op, spec.parallelism);
    st->tuned_buffer = spec.autotune_buffer;
    if (st->sink) ++impl_->sink_count;
    st->passes_through = st->aggregate && info.traits.role == OperatorRole::Repeats && st->registered->abi_minor >= 10;
    impl_->stages.push_back(std::move(st));
  }
  if (g.autotunes()) impl_->set_autotune_budgets();
  if (options.lineage)
    for (auto& st : impl_->stages)
      if (st->sink) {
        st->ledger = std::make_unique<DeliveryLedger>();
        st->ledger->set_worker(static_cast<std::uint32_t>(options.worker_index), static_cast<std::uint32_t>(options.worker_count));
      }
  // Rows are followed only where a job of another number of workers could use them, or for lineage.
  if ((options.rows_of_outputs && why_not_on_other_workers().empty()) || options.lineage)
    for (auto& st : impl_->stages)
      if (st->aggregate) st->stacks = dynamic_cast<StacksItsInputs*>(st->op.get());
  if (options.lineage)
    for (auto& st : impl_->stages) st->draws_keys = st->map && st->registered->info.traits.random;
  if (options.resume_from) {
    if (auto refusals = checkpoint_refusals(); !refusals.empty())
      throw Error("this pipeline cannot resume from a checkpoint: " + refusals.front());
    impl_->resume = options.resume_from;
    impl_->attach_resume_state();
  } else if (!options.resume_workers.empty()) {
    if (auto refusals = checkpoint_refusals(); !refusals.empty())
      throw Error("this pipeline cannot resume from a checkpoint: " + refusals.front());
    impl_->resume_workers = options.resume_workers;
    impl_->attach_resume_on_other_workers();
  }
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
  I.start_operators();
  I.restore_states();
  const auto wanted_by_reader = I.plan_iterations();
  I.group_per_input_stages();
  I.fuse_stages();
  I.make_buffers(wanted_by_reader);
  I.choose_chunks();
  I.restore_ordered_positions();
  I.launch_workers();
}

// (EngineOptions::lineage) The records the epochs read, and those the run was told to skip, for
// the delivery ledger's verdicts.
void Engine::Impl::add_records_known(DeliveryLedger& into) const {
  into.merge(files_read);
  for (auto& st : stages) {
    if (const auto* knows = st->source ? dynamic_cast<const KnowsItsRecords*>(st->op.get()) : nullptr)
      for (const auto& file : knows->records_per_file()) into.know_records(file.where, file.first, file.end);
    if (const auto* skips = dynamic_cast<const NamesSkippedRecords*>(st->op.get()))
      for (const auto& record : skips->skipped_records()) into.skip_as_asked(record.where, record.record);
  }
}

void Engine::Impl::start_operators() {
  // Downstream first, so that memory a stage offers (a GPU feed's pinned pool) reaches the
  // stages before it, through those that keep shapes, to the one that builds the elements.
  for (int i = static_cast<int>(stages.size()) - 1; i >= 0; --i) {
    auto& st = stages[i];
    try {
      st->op->start(st->info);
      st->started = true;
      Placement* placement = st->op->offered_placement();
      // Only to a producer whose output this stage alone reads (a tee's elements go elsewhere too),
      // in input order (rows are placed by their index).
      const int sole_input = st->spec->inputs.size() == 1 ? st->spec->inputs[0] : -1;
      // Not within per-input stages: each input has operators of its own, not this one's rows.
      if (placement && sole_input >= 0 && stages[sole_input]->map && graph.stages[sole_input].sole_consumer() == i &&
          stages[sole_input]->spec->keeps_order(graph.deterministic) &&
          !st->spec->per_input && !stages[sole_input]->spec->per_input)
        stages[sole_input]->info.placement = placement;
      if (Allocator* offered = st->op->offered_allocator()) {
        for (int up = sole_input, reader = i; up >= 0 && graph.stages[up].sole_consumer() == reader;) {
          auto& producer = *stages[up];
          producer.info.allocator = offered;
          if (!producer.spec->op->info.traits.keeps_shape || producer.spec->inputs.size() != 1) break;
          reader = up;
          up = producer.spec->inputs[0];
        }
      }
    } catch (const std::exception& e) {
      for (auto& other : stages)
        if (other->started) {
          try {
            other->op->finish(false);
          } catch (...) {
          }
          other->started = false;
        }
      throw StageStartError(fmt::format("stage '{}' ({}) could not start: {}", st->spec->id, st->spec->op->info.name, e.what()),
                            st->spec->id);
    }
  }
}

void Engine::Impl::restore_states() {
  // A resumed run: every operator takes back the state it saved (after start(), which checks its
  // parameters and inputs as in any run).
  find_read_paths();
  for (auto& st : stages) {
    try {
      if (st.get() == resharded_source)
        restore_on_other_workers();
      else
        restore_operator(*st);
    } catch (const std::exception& e) {
      for (auto& other : stages) {
        try {
          other->op->finish(false);
        } catch (...) {
        }
        other->started = false;
      }
      throw Error(fmt::format("stage '{}' ({}) could not resume from the checkpoint: {}", st->spec->id, st->spec->op->info.name, e.what()));
    }
  }
}

std::vector<std::vector<std::int64_t>> Engine::Impl::plan_iterations() {
  // Iterations: each sink reads one iteration of its input; going upstream, a repeat multiplies
  // the passes it needs and a filled cache needs none; a combine reads one iteration of each input
  // per output iteration. Epochs scale the same way. A stage read by several stages makes what the
  // most demanding reader wants, and each reader gets its own number of iterations (Outputs);
  // its epochs are those its first reader sees.
  std::vector<std::vector<std::int64_t>> wanted_by_reader(stages.size());
  for (int i = static_cast<int>(stages.size()) - 1; i >= 0; --i) {
    auto& st = *stages[i];
    const auto& consumers = st.spec->consumers;
    if (!consumers.empty()) {
      st.demand = 0;
      for (int consumer : consumers) {
        auto& c = *stages[consumer];
        const std::int64_t wanted = c.aggregate ? c.aggregate->input_passes(c.demand) : c.demand;
        wanted_by_reader[i].push_back(wanted);
        if (st.demand != kUnbounded) st.demand = wanted == kUnbounded ? kUnbounded : std::max(st.demand, wanted);
      }
      st.first_output_epoch = stages[consumers.front()]->first_input_epoch;
    } else {
      st.first_output_epoch = options.first_epoch;
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
  return wanted_by_reader;
}

void Engine::Impl::group_per_input_stages() {
  // Per-input stages join the group of the interleave they read (directly or through other
  // per-input stages): its readers run them for each input (stage_per_input.cpp), and the last
  // one's output is the group's.
  for (auto& st_ptr : stages) {
    auto& st = *st_ptr;
    if (!st.spec->per_input) continue;
    StageRuntime& input = *stages[static_cast<std::size_t>(st.spec->inputs.front())];
    StageRuntime& head = input.fused_head ? *input.fused_head : input;
    head.fused.push_back(&st);
    st.fused_head = &head;
  }
}

// A source's stateless maps and filters on one worker between it and the expand that reads what
// they leave (a file list's shard before its reader) run on the source's thread: a cut then finds
// the source's buffer right before the expand, which takes it where it stands (stage_source.cpp).
// Apart, each cut let the filter push its pending outputs into the reader's buffer past its
// bounds, and a pipeline cut every step (Python's state_dict()) grew its states without end. (A
// source given a buffer_size of its own keeps that buffer, and its stages apart.)
void Engine::Impl::fuse_into_sources() {
  auto joins = [&](const StageRuntime& next) {
    return (next.map || next.filter) && !next.spec->per_input && next.spec->op->info.traits.stateless && next.workers == 1 && !next.tuned_workers &&
           !next.fused_head && next.fused.empty();
  };
  for (auto& st_ptr : stages) {
    auto& source = *st_ptr;
    if (!source.source || source.spec->buffer_size > 0 || source.tuned_buffer) continue;
    std::vector<StageRuntime*> chain;
    for (int next = source.spec->sole_consumer(); next >= 0 && joins(*stages[next]); next = stages[next]->spec->sole_consumer()) {
      chain.push_back(stages[next].get());
      if (chain.back()->spec->buffer_size > 0 || chain.back()->tuned_buffer || chain.back()->op->preferred_buffer() > 0) break;
    }
    while (!chain.empty()) {  // the chain ends where an expand reads it
      const int reader = chain.back()->spec->sole_consumer();
      if (reader >= 0 && stages[reader]->expand && !stages[reader]->spec->per_input) break;
      chain.pop_back();
    }
    for (StageRuntime* member : chain) {
      source.fused.push_back(member);
      member->fused_head = &source;
    }
  }
}

void Engine::Impl::fuse_stages() {
  if (graph.fuse) fuse_into_sources();
  // Fuse a stateless map with the stateless map or filter that reads it, when they run on as many
  // workers and the map asks for no buffer of its own (prefetch does, and an explicit buffer_size).
  if (graph.fuse) {
    for (auto& st_ptr : stages) {
      auto& st = *st_ptr;
      if (!st.map || st.spec->sole_consumer() < 0 || st.spec->buffer_size > 0 || st.tuned_buffer || st.op->preferred_buffer() > 0) continue;
      if (st.spec->per_input) continue;
      if (!st.spec->op->info.traits.stateless) continue;
      auto& next = *stages[st.spec->sole_consumer()];
      if (!(next.map || next.filter) || next.spec->per_input || !next.spec->op->info.traits.stateless || next.workers != st.workers ||
          next.tuned_workers != st.tuned_workers)
        continue;
      // A group keeps its head's order: stages that differ in `deterministic` stay apart.
      if (next.spec->keeps_order(graph.deterministic) != st.spec->keeps_order(graph.deterministic)) continue;
      // Two maps that both take chunks stay apart: a fused group runs element by element, and a
      // chunk handed from one to the other costs one hand-over for hundreds of rows.
      auto takes_chunks = [](StageRuntime& s) {
        auto* chunked = dynamic_cast<ChunkedMap*>(s.op.get());
        return s.map && chunked && chunked->maps_chunks();
      };
      if (options.chunks && !st.fused_head && takes_chunks(st) && takes_chunks(next)) continue;
      StageRuntime& head = st.fused_head ? *st.fused_head : st;
      head.fused.push_back(&next);
      next.fused_head = &head;
    }
  }
}

// An interleave's inputs (file names, mostly) are each read for many outputs: a few waiting
// suffice, where a buffer of default_buffer filled with names from an endless list (`list_files()
// .repeat()`) that every checkpoint then holds (1,260 of them, 305 KB of the image benchmark's
// 347 KB state). 0 when stage `i`'s output (through repeats) is not an interleave's input.
std::size_t Engine::Impl::inputs_an_interleave_wants_ahead(int i) const {
  int reader = graph.stages[i].sole_consumer();
  while (reader >= 0 && stages[reader]->passes_through) reader = graph.stages[reader].sole_consumer();
  if (reader < 0 || !stages[reader]->expand || graph.stages[reader].per_input) return 0;
  return std::max<std::size_t>(16, 4 * static_cast<std::size_t>(std::max(1, graph.stages[reader].cycle_length)));
}

void Engine::Impl::make_buffers(const std::vector<std::vector<std::int64_t>>& wanted_by_reader) {
  for (int i = static_cast<int>(stages.size()) - 1; i >= 0; --i) {
    auto& st = *stages[i];
    const int consumer = st.spec->sole_consumer();
    const bool feeds_own_group = consumer >= 0 && stages[consumer]->fused_head &&
                                 (stages[consumer]->fused_head == &st || stages[consumer]->fused_head == st.fused_head);
    if (!st.sink && !feeds_own_group) {
      std::size_t capacity = st.spec->buffer_size > 0 ? static_cast<std::size_t>(st.spec->buffer_size) : st.op->preferred_buffer();
      std::uint64_t byte_limit = 0;
      if (capacity == 0 || st.tuned_buffer) {
        capacity = options.default_buffer;
        byte_limit = options.default_buffer_bytes;
      }
      if (st.spec->buffer_size == 0 && st.op->preferred_buffer() == 0 && !st.tuned_buffer)
        if (const std::size_t ahead = inputs_an_interleave_wants_ahead(i); ahead > 0) capacity = std::min(capacity, ahead);
      st.output = std::make_unique<Outputs>(st.spec->consumers.size(), capacity, byte_limit, stopping);
      for (std::size_t k = 0; k < st.spec->consumers.size(); ++k) st.output->set_wanted_iterations(k, wanted_by_reader[i][k]);
    }
  }
  // Under autotune every buffer, an explicit one too, holds at most its share of the buffers'
  // part of the RAM budget; the tuner moves memory to the buffers that need it.
  if (autotune) {
    std::size_t buffers = 0;
    for (auto& st : stages) buffers += st->output ? st->output->readers() : 0;
    const std::uint64_t share = buffers > 0 ? std::max<std::uint64_t>(1, buffer_budget / buffers) : 0;
    for (auto& st : stages)
      if (st->output) {
        const std::uint64_t limit = st->output->byte_limit();
        st->output->resize(st->output->capacity(), limit == 0 ? share : std::min(limit, share));
      }
  }
  // Each reader takes its own buffer of each of its inputs.
  for (std::size_t i = 0; i < stages.size(); ++i) {
    auto& st = *stages[i];
    if (st.fused_head) continue;
    for (int producer : st.spec->inputs) {
      const auto& readers = graph.stages[producer].consumers;
      const auto k = static_cast<std::size_t>(std::find(readers.begin(), readers.end(), static_cast<int>(i)) - readers.begin());
      st.inputs.push_back(&stages[producer]->output->reader(k));
      st.input_stages.push_back(producer);
    }
    if (!st.inputs.empty()) st.input = st.inputs.front();
  }
}

void Engine::Impl::choose_chunks() {
  // Chunks: a stage takes them when its operator offers the chunked form (a map running alone, not
  // fused with others, or an aggregate); a stage that makes elements in runs (an expand, a chunked
  // map) hands chunks on when every reader takes them, and elements otherwise.
  if (options.chunks) {
    for (auto& st : stages) {
      if (st->fused_head || !st->fused.empty()) continue;
      if (st->map)
        if (auto* chunked = dynamic_cast<ChunkedMap*>(st->op.get()); chunked && chunked->maps_chunks()) st->chunked_map = chunked;
      if (st->aggregate) st->chunked_aggregate = dynamic_cast<ChunkedAggregate*>(st->op.get());
    }
    // Readers before producers (a repeat takes chunks when its own readers do: it is transparent).
    for (auto it = stages.rbegin(); it != stages.rend(); ++it) {
      auto& st = *it;
      if (!(st->expand || st->chunked_map || st->passes_through) || st->spec->consumers.empty()) continue;
      // A plugin built for 6.2 may make no Ragged column and knows none: its chunks go to any
      // reader that takes chunks, a newer producer's only to readers that know Ragged columns (a
      // stage passing chunks through hands on any producer's).
      const bool may_make_ragged = st->passes_through || st->registered->abi_minor >= 3;
      st->emits_chunks = std::all_of(st->spec->consumers.begin(), st->spec->consumers.end(), [&](int reader) {
        const auto& r = *stages[static_cast<std::size_t>(reader)];
        const bool takes = r.passes_through ? r.emits_chunks : r.chunked_map || r.chunked_aggregate;
        return takes && (!may_make_ragged || r.registered->abi_minor >= 3);
      });
    }
  }
}

// Whether `st` is an ordered parallel stage (a map) whose loop takes its positions from here.
bool Engine::Impl::keeps_ordered_positions(const StageRuntime& st) const {
  return st.restore && !st.restore->ended() && !st.fused_head && !st.source && !st.aggregate && !st.expand && !st.combine;
}

// Where the stage before `st` stood at the cut, as (epoch, elements it had handed on in it), when
// it is a reader or a map: nothing after it can have taken more.
std::optional<std::pair<std::uint64_t, std::uint64_t>> Engine::Impl::position_before(const StageRuntime& st) const {
  if (st.spec->inputs.size() != 1 || st.spec->per_input) return std::nullopt;
  const StageRuntime& before = *stages[st.spec->inputs[0]];
  if (!before.restore || before.restore->ended() || before.spec->per_input || before.fused_head) return std::nullopt;
  auto positions = engine_state_reader(before);
  if (before.expand) {
    const auto epoch = positions->get<std::uint64_t>();
    positions->get<std::uint64_t>();  // inputs opened
    return std::make_pair(epoch, positions->get<std::uint64_t>());
  }
  if (!keeps_ordered_positions(before) || before.map == nullptr) return std::nullopt;
  const auto iteration = positions->get<std::uint64_t>();
  return std::make_pair(iteration, positions->get<std::uint64_t>());
}

void Engine::Impl::restore_ordered_positions() {
  // A resumed run: ordered parallel stages go on from their saved positions (the loops of the
  // other kinds read their own).
  for (auto& st : stages) {
    if (!keeps_ordered_positions(*st)) continue;
    auto positions = engine_state_reader(*st);
    st->in_iteration = positions->get<std::uint64_t>();
    st->in_index = positions->get<std::uint64_t>();
    // A position past what the stage before it had handed on was not written by a run (a map
    // takes its input's elements in order, the cut between two of them).
    if (const auto before = position_before(*st);
        before && (st->in_iteration > before->first || (st->in_iteration == before->first && st->in_index > before->second)))
      throw DataError(fmt::format("{} cannot resume: the checkpoint puts it at element {} of epoch {}, past what stage '{}' before it had "
                                  "handed on (element {} of epoch {}); the checkpoint was changed: resume from one Sluice wrote",
                                  stage_label(*st), st->in_index, st->in_iteration, stages[st->spec->inputs[0]]->spec->id, before->second,
                                  before->first));
    st->counters.epoch.store(st->in_iteration);
    if (!st->sink) st->exit().output->set_iteration(st->in_iteration);
  }
}

void Engine::Impl::launch_workers() {
  start_ns = now_ns();
  state.store(static_cast<int>(RunState::Running));
  int planned_workers = 0;
  for (auto& st : stages)
    if (!st->fused_head) planned_workers += st->threads();
  {
    std::lock_guard lock(done_mutex);
    live_workers += planned_workers;
  }
  // A thread that cannot be created (a process or cgroup thread limit) ends the run with the
  // stage named; the workers it would have run are no longer waited for.
  bool thread_failed = false;
  for (auto& st : stages) {
    for (int w = 0; w < st->threads() && !st->fused_head && !thread_failed; ++w) {
      try {
        threads.emplace_back([this, s = st.get(), w] { worker(*s, w); });
      } catch (const std::system_error& e) {
        fail(fmt::format("{} could not start worker {} of {}: {} (the process may be at its thread limit: lower "
                           "parallelism or cycle_length, or raise `ulimit -u`)",
                           stage_label(*st), w + 1, st->threads(), e.what()),
               st.get());
        thread_failed = true;
      }
    }
    if (thread_failed) break;
  }
  if (thread_failed) {
    std::lock_guard lock(done_mutex);
    live_workers -= planned_workers - static_cast<int>(threads.size());
    if (live_workers == 0) {
      end_ns.store(now_ns());
      done_cv.notify_all();
    }
  }
  try {
    if (autotune) tuner = std::thread([this] { run_tuner(); });
    publisher = std::thread([this] { run_publisher(); });
  } catch (const std::system_error& e) {
    fail(fmt::format("the metrics thread could not start: {} (the process may be at its thread limit)", e.what()));
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
  return {static_cast<RunState>(I.state.load()), I.error, I.failed_stage, I.stopped_at_checkpoint.load() && !I.failed};
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

std::string Engine::why_not_replayed_directly() const {
  Impl::ReplayChain chain;
  return impl_->replay_chain(chain);
}

void Engine::replay(ReplayAt at) {
  auto& I = *impl_;
  if (I.state.load() != static_cast<int>(RunState::Created)) throw Error("the engine was already started");
  if (const std::string why = I.replay_chain(I.replaying); !why.empty()) throw Error("this pipeline cannot replay a step directly: " + why);
  I.replay_at = at;
  I.start_operators();
  I.launch_replay();
}

DeliveryLedger Engine::delivery_ledger(bool deliveries) const {
  DeliveryLedger ledger;
  if (deliveries)
    for (auto& st : impl_->stages)
      if (st->ledger) ledger.merge(*st->ledger);
  if (impl_->state.load() != static_cast<int>(RunState::Created)) impl_->add_records_known(ledger);
  ledger.set_run_ended(state() == RunState::Finished);
  return ledger;
}

}  // namespace sluice
