// Snapshots of every stage's counters, the bottleneck, and their publication to subscribers.
#include "engine_impl.hpp"

#include <chrono>

#include "sluice/core/report.hpp"

namespace sluice {

namespace {
// Recent rates are over the last 2 s: long enough that a stage handing on chunks of thousands of
// elements a few times a second reads as a steady rate, short enough to follow a change.
constexpr std::uint64_t kRecentRateWindowNs = 2'000'000'000;


// What a stage's output buffer holds, overall and per reader.
void put_buffers(const StageRuntime& st, const Graph& graph, metrics::StageMetrics* m) {
  Channel& buffer = st.output->fullest();
  m->set_buffer_level(static_cast<std::uint32_t>(buffer.level()));
  m->set_buffer_capacity(static_cast<std::uint32_t>(buffer.capacity()));
  m->set_buffer_bytes(buffer.level_bytes());
  m->set_buffer_byte_limit(buffer.byte_limit());
  m->set_mean_buffer_fill(buffer.mean_fill());
  auto [empty, full] = buffer.empty_and_full_fractions();
  m->set_buffer_empty_fraction(empty);
  m->set_buffer_full_fraction(full);
  m->set_buffer_swings(buffer.swings());
  for (std::size_t k = 0; k < st.output->readers(); ++k) {
    Channel& edge = st.output->reader(k);
    auto* r = m->add_readers();
    r->set_reader(graph.stages[st.spec->consumers[k]].id);
    r->set_level(static_cast<std::uint32_t>(edge.level()));
    r->set_capacity(static_cast<std::uint32_t>(edge.capacity()));
    r->set_bytes(edge.level_bytes());
    r->set_byte_limit(edge.byte_limit());
    r->set_mean_fill(edge.mean_fill());
    auto [edge_empty, edge_full] = edge.empty_and_full_fractions();
    r->set_empty_fraction(edge_empty);
    r->set_full_fraction(edge_full);
  }
}

// The fields of its outputs seen so far, and (for the next snapshot) one more output to look at.
void put_observed_fields(StageRuntime& st, metrics::StageMetrics* m) {
  {
    std::lock_guard lock(st.observed_mutex);
    for (const auto& f : st.observed) {
      auto* shape = m->add_output_fields();
      shape->set_name(f.name);
      shape->set_dtype(dtype_name(f.dtype));
      for (auto d : f.min) shape->add_min_dims(d);
      for (auto d : f.max) shape->add_max_dims(d);
    }
    m->set_output_samples(st.observed_outputs);
  }
  st.sample_output.store(true, std::memory_order_relaxed);
}

void put_remote(const StageRuntime& st, metrics::StageMetrics* m) {
  const auto& r = st.remote_storage.counters();
  auto* remote = m->mutable_remote();
  remote->set_requests(r.requests.load(std::memory_order_relaxed));
  remote->set_bytes(r.bytes.load(std::memory_order_relaxed));
  remote->set_retries(r.retries.load(std::memory_order_relaxed));
  remote->set_throttles(r.throttles.load(std::memory_order_relaxed));
  remote->set_errors(r.errors.load(std::memory_order_relaxed));
  remote->set_cache_hits(r.cache_hits.load(std::memory_order_relaxed));
  remote->set_cache_bytes(r.cache_bytes.load(std::memory_order_relaxed));
  remote->set_latency_p50_ms(static_cast<double>(r.latency_quantile_us(0.5)) / 1000.0);
  remote->set_latency_p99_ms(static_cast<double>(r.latency_quantile_us(0.99)) / 1000.0);
}

// Rates over the recent window: the oldest sample kept is the last one at least the window old
// (or the first of the run).
void put_recent_rates(StageRuntime& st, metrics::StageMetrics* m, std::uint64_t now, std::uint64_t el_out, std::uint64_t by_out) {
  while (st.rate_samples.size() > 1 && st.rate_samples[1].ns + kRecentRateWindowNs <= now) st.rate_samples.pop_front();
  if (!st.rate_samples.empty() && now > st.rate_samples.front().ns) {
    const auto& since = st.rate_samples.front();
    const double dt = (now - since.ns) / 1e9;
    m->set_recent_elements_per_s((el_out - std::min(el_out, since.elements)) / dt);
    m->set_recent_bytes_per_s((by_out - std::min(by_out, since.bytes)) / dt);
  } else {
    m->set_recent_elements_per_s(m->elements_per_s());
    m->set_recent_bytes_per_s(m->bytes_per_s());
  }
}

// A feed sink's devices: bytes and slices sent, ring levels, rates over the run and since the
// last snapshot, and the copies' own rate where the feed times them on the device.
void put_devices(StageRuntime& st, metrics::StageMetrics* m, std::uint64_t now, double elapsed_ns) {
  auto devices = st.sink->device_counters();
  std::vector<DeviceCopyTime> copies;
  if (auto* timed = dynamic_cast<const TimesDeviceCopies*>(st.sink)) copies = timed->device_copy_times();
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
    if (d < copies.size() && copies[d].seconds > 0) {
      dm->set_copy_seconds(copies[d].seconds);
      dm->set_copy_bytes_per_s(static_cast<double>(copies[d].bytes) / copies[d].seconds);
    }
  }
}

// What the stage is: its operator, workers, inputs and traits.
void put_identity(const StageRuntime& st, const Graph& graph, metrics::StageMetrics* m) {
  m->set_id(st.spec->id);
  m->set_op(st.spec->op->info.name);
  m->set_kind(operator_kind_name(st.spec->op->info.kind));
  m->set_role(role_name(st.spec->op->info.traits.role));
  // A fused member runs in its head's workers.
  const StageRuntime& runner = st.fused_head ? *st.fused_head : st;
  m->set_workers(static_cast<std::uint32_t>(runner.running_workers()));
  if (runner.tuned_workers) {
    m->set_workers_tuned(true);
    m->set_max_workers(static_cast<std::uint32_t>(runner.workers));
  }
  m->set_buffer_tuned(st.tuned_buffer);
  for (int in : st.spec->inputs) m->add_inputs(graph.stages[in].id);
  if (st.fused_head) m->set_fused_with(st.fused_head->spec->id);
  m->set_stateless(st.spec->op->info.traits.stateless);
  m->set_assembles_in_parallel(st.assembles_in_parallel);
  m->set_per_input(st.spec->per_input);
  m->set_random(st.spec->op->info.traits.random);
}

// Its counts, and the fractions of its workers' time busy, starved and blocked.
void put_counts(StageRuntime& st, metrics::StageMetrics* m, std::uint64_t now, std::uint64_t start_ns, double elapsed_ns) {
  const auto& c = st.counters;
  StageRuntime& runner = st.fused_head ? *st.fused_head : st;
  std::uint64_t el_out = c.elements_out.load(), by_out = c.bytes_out.load(), el_in = c.elements_in.load();
  m->set_elements_in(el_in);
  m->set_elements_out(el_out);
  m->set_chunked_elements_out(c.chunked_elements_out.load(std::memory_order_relaxed));
  m->set_chunks_out(c.chunks_out.load(std::memory_order_relaxed));
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
  m->set_expected_elements(st.expected_elements.load(std::memory_order_relaxed));
  m->set_pass_position(st.pass_position.load(std::memory_order_relaxed));
  m->set_pass_elements(st.pass_elements.load(std::memory_order_relaxed));
  m->set_pass_epoch(st.pass_epoch.load(std::memory_order_relaxed));
  m->set_errors_skipped(c.errors_skipped.load());
  m->set_elements_reread(st.reread.load());
  m->set_padding_values(st.operator_counters.padding.load(std::memory_order_relaxed));
  m->set_data_values(st.operator_counters.data.load(std::memory_order_relaxed));
  m->set_epoch(c.epoch.load());
}

void put_skip_reasons(StageRuntime& st, metrics::StageMetrics* m) {
  std::lock_guard rl(st.reasons_mutex);
  for (const auto& r : st.skip_reasons) m->add_skip_reasons(r);
  for (const auto& [kind, count] : st.skip_reason_counts) (*m->mutable_skip_reason_counts())[kind] = count;
}

}  // namespace

metrics::MetricsSnapshot Engine::Impl::make_snapshot() const {
  std::lock_guard lock(snapshot_mutex);
  metrics::MetricsSnapshot snap;
  const std::uint64_t now = end_ns.load() ? end_ns.load() : now_ns();
  const double elapsed_ns = start_ns ? static_cast<double>(now - start_ns) : 0.0;
  put_run(snap, elapsed_ns);
  for (const auto& st_ptr : stages) put_stage(*st_ptr, snap.add_stage(), now, elapsed_ns);
  if (autotune) put_autotune(snap);
  if (options.lineage) put_ledger(snap);
  Bottleneck b = find_bottleneck(snap);
  if (b.stage >= 0) {
    snap.set_bottleneck(snap.stage(b.stage).id());
    snap.set_bottleneck_reason(b.reason);
  }
  return snap;
}

// The run's own fields: its sequence number, times, state and failure, and this worker.
void Engine::Impl::put_run(metrics::MetricsSnapshot& snap, double elapsed_ns) const {
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
  auto* w = snap.mutable_worker();
  w->set_index(graph.worker.index);
  w->set_count(graph.worker.count);
  w->set_source(graph.worker.origin());
  for (const auto& note : graph.worker_notes) w->add_notes(note);
}

void Engine::Impl::put_stage(StageRuntime& st, metrics::StageMetrics* m, std::uint64_t now, double elapsed_ns) const {
  put_identity(st, graph, m);
  put_counts(st, m, now, start_ns, elapsed_ns);
  if (st.output) put_buffers(st, graph, m);
  put_observed_fields(st, m);
  if (st.remote_storage.used()) put_remote(st, m);
  put_skip_reasons(st, m);
  const std::uint64_t el_out = m->elements_out(), by_out = m->bytes_out();
  put_recent_rates(st, m, now, el_out, by_out);
  if (st.sink) put_devices(st, m, now, elapsed_ns);
  st.previous_ns = now;
  st.rate_samples.push_back({now, el_out, by_out});
}

// (EngineOptions::lineage) What the sinks were given, judged epoch by epoch: the report, /metrics
// and the studio show it as the run goes.
void Engine::Impl::put_ledger(metrics::MetricsSnapshot& snap) const {
  DeliveryLedger ledger;
  for (const auto& st : stages)
    if (st->ledger) ledger.merge(*st->ledger);
  if (ledger.empty()) return;
  add_records_known(ledger);
  ledger.set_run_ended(static_cast<RunState>(state.load()) == RunState::Finished);
  for (const EpochVerdict& v : ledger.verdicts(0)) {
    auto* out = snap.add_ledger();
    out->set_epoch(v.epoch);
    out->set_records(v.records);
    out->set_deliveries(v.deliveries);
    if (v.expected) out->set_expected(*v.expected);
    out->set_twice(v.twice);
    out->set_missing(v.missing);
    out->set_skipped_as_asked(v.skipped_as_asked);
    out->set_under_way(v.under_way);
    out->set_digest(v.digest);
    out->set_unnamed(v.unnamed);
  }
}

void Engine::Impl::put_autotune(metrics::MetricsSnapshot& snap) const {
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

void Engine::Impl::publish(const metrics::MetricsSnapshot& snap) {
  for (auto& subscriber : subscribers) {
    try {
      subscriber(snap);
    } catch (...) {
      // An observer's failure must never disturb the run.
    }
  }
}

void Engine::Impl::run_publisher() {
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

}  // namespace sluice
