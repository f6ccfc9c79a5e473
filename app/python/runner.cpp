// One run of a pipeline from Python (sluice.Pipeline's native part): its engine, its metrics
// server, the queue its iterator reads, its checkpoints and its stop.
#include "native.hpp"

namespace sluice::python {

// ---- a run ------------------------------------------------------------------------------------

// The pipeline's output goes to Python: to a python_iterator stage taking the place of its sink
// (or after its last stage when it has none), which is returned. A gpu_feed sink stays (its
// slices are read through Engine::feed): `feed_stage` gets its id and nothing is returned.
// `output` names the stage Python reads when the pipeline ends in several (a tee): a sink is
// replaced, any other stage gets the iterator as one more reader. Without it, a pipeline with
// several ends is refused when `ambiguous_is_error` (an iteration), else left as it is.
spec::Stage* attach_iterator(PipelineDocument& doc, const Registry& r, std::string& feed_stage, const std::string& output,
                             bool ambiguous_is_error) {
  std::set<std::string> consumed;
  for (const auto& st : doc.spec.stage())
    for (const auto& in : st.input()) consumed.insert(in);
  std::vector<int> ends;
  if (!output.empty()) {
    for (int i = 0; i < doc.spec.stage_size(); ++i)
      if (doc.spec.stage(i).id() == output) ends.push_back(i);
    if (ends.empty()) {
      std::string ids;
      for (const auto& st : doc.spec.stage()) ids += (ids.empty() ? "'" : ", '") + st.id() + "'";
      throw py::value_error(fmt::format("output='{}' names no stage of {}; its stages: {}", output, doc.file, ids));
    }
  } else {
    for (int i = 0; i < doc.spec.stage_size(); ++i)
      if (!consumed.count(doc.spec.stage(i).id())) ends.push_back(i);
    if (ends.size() > 1 && ambiguous_is_error) {
      std::string ids;
      for (int i : ends) ids += (ids.empty() ? "'" : ", '") + doc.spec.stage(i).id() + "'";
      throw py::value_error(fmt::format("{} ends in {} stages ({}): pass output='STAGE' to say which one Python iterates "
                                        "(the others run as written, their sinks writing their files)",
                                        doc.file, ends.size(), ids));
    }
  }
  if (ends.size() != 1) return nullptr;  // validation names what is wrong
  auto& last = *doc.spec.mutable_stage(ends.front());
  auto op = r.find(last.op());
  if (op && op->info.kind == OperatorKind::Sink) {
    if (op->info.name == "gpu_feed") {
      feed_stage = last.id();
      return nullptr;
    }
    last.set_op("python_iterator");
    last.clear_params();
    last.clear_parallelism();
    return &last;
  }
  std::string id = "python";
  for (int n = 2; std::any_of(doc.spec.stage().begin(), doc.spec.stage().end(), [&](const auto& s) { return s.id() == id; }); ++n)
    id = "python_" + std::to_string(n);
  const std::string input = last.id();
  auto* sink = doc.spec.add_stage();
  sink->set_id(id);
  sink->set_op("python_iterator");
  sink->add_input(input);
  return sink;
}

DeliveryLedger ledger_from_bytes(const std::string& bytes, const std::string& what) {
  checkpoint::Ledger message;
  if (!message.ParseFromString(bytes)) throw py::value_error(what + " is damaged: it does not decode");
  try {
    return DeliveryLedger::load(message, what);
  } catch (const Error& e) {
    throw py::value_error(e.what());
  }
}

// A ledger's verdicts as Python takes them: a dict per epoch.
py::list verdicts_to_python(const std::vector<EpochVerdict>& verdicts) {
  auto named = [](const std::vector<EpochVerdict::Record>& records) {
    py::list out;
    for (const auto& r : records) out.append(py::make_tuple(r.where, r.record));
    return out;
  };
  py::list out;
  for (const auto& v : verdicts) {
    py::dict d;
    d["epoch"] = v.epoch;
    d["records"] = v.records;
    d["deliveries"] = v.deliveries;
    d["expected"] = v.expected ? py::cast(*v.expected) : py::none();
    d["twice"] = v.twice;
    d["missing"] = v.missing;
    d["twice_named"] = named(v.twice_named);
    d["missing_named"] = named(v.missing_named);
    d["unnamed"] = v.unnamed;
    d["skipped_as_asked"] = v.skipped_as_asked;
    d["under_way"] = v.under_way;
    d["digest"] = v.digest;
    out.append(d);
  }
  return out;
}

// One run of a pipeline: its engine, its metrics server, and the queue its iterator reads.
class Runner {
 public:
  Runner(const std::string& text, const std::string& file, const std::map<std::string, std::string>& sets,
         std::optional<std::uint64_t> seed, const std::vector<std::string>& plugin_dirs, const std::string& metrics_addr, bool iterate,
         std::uint64_t first_epoch, std::optional<int> worker_index, std::optional<int> num_workers,
         const std::string& output, const std::string& resume, const std::vector<std::string>& resume_job, bool lineage,
         const std::vector<std::string>& ledgers, std::optional<std::uint64_t> replay_step) {
    if (lineage)
      for (const auto& ledger : ledgers) ledger_.merge(ledger_from_bytes(ledger, "the ledger given"));
    std::shared_ptr<checkpoint::Checkpoint> resume_from;
    std::vector<std::shared_ptr<const checkpoint::Checkpoint>> job;
    try {
      if (!resume.empty()) resume_from = std::make_shared<checkpoint::Checkpoint>(parse_state(resume, "the state given to load_state_dict()"));
      // A state taken before the first cut of a run that continued another job's states: that
      // job's states again, and the outputs since made again and dropped.
      const std::vector<std::string> continued =
          resume_from && resume_from->stages_size() == 0 && resume_from->continued_job_size() > 0
              ? std::vector<std::string>(resume_from->continued_job().begin(), resume_from->continued_job().end())
              : resume_job;
      job = states_of_job(continued, "given to load_state_dict()");
    } catch (const Error& e) {
      throw py::value_error(e.what());
    }
    std::shared_ptr<checkpoint::Checkpoint> continued_state;  // a state of this worker, of such a run's start
    if (!job.empty()) {
      first_epoch = job.front()->first_epoch();
      continued_job_ = resume_from ? std::vector<std::string>(resume_from->continued_job().begin(), resume_from->continued_job().end()) : resume_job;
      if (resume_from) drop_left_ = resume_from->outputs_to_skip();
      continued_state = std::move(resume_from);
    } else if (resume_from) {
      base_ = *resume_from;
      first_epoch = base_.first_epoch();
      // The outputs the loop had taken after the cut are made again and dropped.
      drop_left_ = base_.outputs_to_skip();
      if (base_.run_ended()) {
        state_ = "finished";
        follows_lineage_ = lineage;
        if (lineage) start_ledger(&base_, {}, 0);
        return;
      }
    }
    Registry* r = nullptr;
    try {
      r = &loaded_registry(plugin_dirs);
    } catch (const Error& e) {
      throw py::value_error(e.what());
    }
    PrepareOptions options = prepare_options(sets, seed);
    options.worker = {worker_index, num_workers, "worker_index/num_workers"};
    PreparedPipeline prepared = prepare(text, file, options, *r, iterate, output);
    // A step replayed where the pipeline cannot make it directly: by running its epoch to it.
    if (replay_step && !(replay_why_ = why_not_replayed_directly(prepared.graph, first_epoch)).empty()) {
      forget_queue();
      prepared = prepare(text, file, options, *r, iterate, output, replay_step);
    }
    const WorkerIdentity worker = prepared.worker;
    std::optional<Graph> graph = std::move(prepared.graph);
    py::gil_scoped_release release;
    try {
      if (!metrics_addr.empty()) {
        server_ = std::make_unique<MetricsServer>(parse_metrics_address(metrics_addr));
        server_->set_pipeline("# " + file + ", run from Python\n" + pipeline_to_text(spec_));
      }
      EngineOptions options;
      options.first_epoch = first_epoch;
      options.resume_from = resume_from;
      options.resume_workers = job;
      options.worker_count = worker.count;
      options.worker_index = worker.index;
      options.rows_of_outputs = true;
      options.lineage = lineage;
      follows_lineage_ = lineage;
      if (lineage) {
        start_ledger(resume_from ? resume_from.get() : continued_state.get(), job, worker.index);
        ledger_.set_worker(static_cast<std::uint32_t>(worker.index), static_cast<std::uint32_t>(worker.count));
      }
      engine_ = std::make_shared<Engine>(std::move(*graph), options);
      if (!resume_from) base_ = engine_->start_state();
      if (continued_state) check_same_worker(*continued_state, base_, *r);
      // A run continuing another job's states begins where they stood: its states before its
      // first cut name them.
      for (const auto& state : continued_job_) base_.add_continued_job(state);
      // A job of another number of workers could continue this run's states: they name the
      // records the loop took after their cut, and a first cut is asked at once, so that no
      // state but the first moments' comes from before any cut.
      follows_rows_ = queue_ && engine_->why_not_on_other_workers().empty();
      if (server_) engine_->subscribe([this](const metrics::MetricsSnapshot& snapshot) { server_->publish(snapshot); });
      if (!feed_stage_.empty()) feed_ = engine_->feed(feed_stage_);
      if (replay_step && replay_why_.empty()) engine_->replay({first_epoch, *replay_step});
      else engine_->start();
      if (queue_) {
        // The sink is finished only in Engine::wait(); this tells the iterator the moment the
        // workers are done, so the end of a run costs no polling delay.
        watcher_ = std::thread([engine = engine_, queue = queue_] {
          while (!engine->wait_for(std::chrono::milliseconds(200))) {
          }
          queue->close();
        });
      }
    } catch (const std::exception& e) {
      engine_.reset();
      forget_queue();
      // As a failure while running: sluice.PipelineError, naming the stage when one refused.
      const auto* refused = dynamic_cast<const StageStartError*>(&e);
      raise_pipeline_error(e.what(), refused ? refused->stage() : std::string());
    }
  }
  ~Runner() { close(); }

  std::string metrics_url() const { return server_ ? server_->url() : std::string(); }

  // The next element as a dict of NumPy arrays (arrays=false: of DlTensor), or None at the end.
  py::object next(bool arrays) {
    Sample sample;
    if (!engine_) throw py::stop_iteration();
    if (feed_) return next_feed_step();
    for (;;) {
      const ElementQueue::Pop got = without_gil([&] { return queue_->pop(sample, std::chrono::milliseconds(50)); });
      if (got == ElementQueue::Pop::Closed) end_of_run();  // the watcher closes it when the workers are done
      if (got == ElementQueue::Pop::Item) {
        ++consumed_;
        if (states_taken_) {
          collect_finished_cut();
          ask_for_cut();
        }
        if (follows_rows_) keep_rows_of(sample);
        if (drop_left_ == 0) {
          if (follows_lineage_) keep_lineage_of(sample);
          break;
        }
        --drop_left_;  // taken before the state was saved: made again to continue exactly, not given twice
        continue;
      }
      stop_if_interrupted();
    }
    return element_to_python(std::move(sample), arrays);
  }
  py::object element_to_python(Sample sample, bool arrays) {
    if (arrays) return to_python(sample);
    py::dict out;
    for (const auto& field : sample.fields()) {
      if (field.tensor.dtype() == DType::Bytes) out[py::str(field.name)] = to_python(field.tensor);
      else out[py::str(field.name)] = py::cast(dl_tensor_of(field.tensor));
    }
    return out;
  }

  // Stops the engine and joins every thread; the run's end state. Safe to call repeatedly, and
  // from several threads at once (the loop's thread ends its run while another closes it): one
  // closes, the others wait for it and get its end. With `patience` (seconds), the engine's
  // threads are waited for that long once stopped; those still inside a call that does not return
  // then (a Python function stuck in a wait) are abandoned, named, and end with the process.
  std::string close(std::optional<double> patience = std::nullopt) {
    if (!engine_) return state_;
    const bool closed_here = without_gil([&] {
      std::lock_guard lock(close_mutex_);
      if (closed_) return false;  // by another thread, which lets go of the engine next
      stop_and_join(patience);
      closed_ = true;
      return true;
    });
    if (!closed_here) return run_state_name(result_.state);
    // With the GIL again: the members the methods of other threads read.
    state_ = run_state_name(result_.state);
    feed_ = nullptr;
    std::shared_ptr<Engine> ended = std::move(engine_);
    without_gil([&] {
      ended.reset();
      server_.reset();
      return true;
    });
    forget_queue();
    return state_;
  }

  // Runs to the end without iterating (a pipeline with its own sinks); raises PipelineError.
  std::string run_to_end() {
    if (!engine_) return state_;
    for (;;) {
      if (without_gil([&] { return engine_->wait_for(std::chrono::milliseconds(100)); })) break;
      stop_if_interrupted();
    }
    finish_and_raise();
    return state_;
  }

  py::dict snapshot() {
    if (engine_) return message_to_python(engine_->snapshot());
    return message_to_python(final_);
  }
  std::string report() {
    if (engine_) return format_report(engine_->snapshot());
    return format_report(final_);
  }
  std::string spec_text() const { return pipeline_to_text(spec_); }

  // Where the iteration stands, as the bytes of a checkpoint: positions only, never elements. The
  // latest cut of the engine that the loop has gone past (or where this run began), plus how many
  // outputs the loop took after it: a resumed run makes those again and drops them, as every
  // output is a function of the seed and the positions. From the first call on, the engine is
  // asked for the next cut as soon as the last is complete (cuts hold nothing up: each stage goes
  // on once it saved), so that a state is taken from close behind the loop: the outputs made
  // again on resume are those the loop took while one cut crossed the buffers.
  py::bytes checkpoint() {
    if (engine_ && feed_) throw py::value_error("state_dict(): a pipeline ending in gpu_feed cannot be checkpointed from Python yet");
    checkpoint::Checkpoint state = base_;  // where this run began
    std::uint64_t after = consumed_, base_output = 0;
    if (engine_) {
      if (auto refusals = engine_->checkpoint_refusals(); !refusals.empty()) {
        std::string text = "state_dict(): this pipeline cannot be checkpointed:";
        for (const auto& r : refusals) text += "\n  " + r;
        throw py::value_error(text);
      }
      collect_finished_cut();
      // The latest cut the loop has gone past: one it has not reached would need the elements
      // between the loop and the cut (queued now) by value.
      for (auto cut = cuts_.rbegin(); cut != cuts_.rend(); ++cut)
        if (cut->outputs_before <= consumed_) {
          state = cut->state;
          base_output = cut->outputs_before;
          after = consumed_ - base_output;
          break;
        }
      ask_for_cut();
      states_taken_ = true;
    }
    state.clear_undelivered();
    state.set_outputs_to_skip(after);
    state.set_python_state(true);
    name_taken_records(state, base_output);
    if (follows_lineage_) ledger_now().save(*state.mutable_ledger());
    std::string bytes;
    state.SerializeToString(&bytes);
    return py::bytes(bytes);
  }
  bool running() const { return engine_ != nullptr; }
  // A replay's: why it ran the epoch to its step (empty: it made the step directly).
  const std::string& replay_why() const { return replay_why_; }

  // The records of output `step` of this iteration (0: the first the loop was given), one dict a
  // row: its source, record, byte offset and the epoch it was read in; a zipped row names its
  // parts. Only the last kLineageKept outputs are kept.
  py::list lineage(std::uint64_t step) const {
    if (!follows_lineage_) throw py::value_error("lineage(): this pipeline does not follow lineage; make it with lineage=True");
    if (lineage_.empty() || step < lineage_first_ || step >= lineage_first_ + lineage_.size())
      throw py::index_error(lineage_.empty() ? fmt::format("lineage(): no output was given yet, so there is no step {}", step)
                                             : fmt::format("lineage(): step {} is not among the last {} kept (steps {} to {}); ask while they are recent",
                                                           step, kLineageKept, lineage_first_, lineage_first_ + lineage_.size() - 1));
    auto record = [](const RecordLineage& r) {
      py::dict d;
      d["source"] = r.where ? py::str(*r.where) : py::str("");
      d["record"] = r.record;
      d["byte_offset"] = r.byte_offset;
      d["epoch"] = r.epoch ? py::cast(*r.epoch) : py::none();
      py::dict keys;  // each random map's: (epoch, index), its numbers' key
      for (const DrawKey& key : r.keys) keys[py::str(*key.stage)] = py::make_tuple(key.epoch, key.index);
      d["keys"] = keys;
      return d;
    };
    py::list rows;
    for (const RowLineage& row : lineage_of(lineage_[step - lineage_first_])) {
      if (!row.zipped) {
        rows.append(record(row.parts.front()));
        continue;
      }
      py::list parts;
      for (const auto& part : row.parts) parts.append(record(part));
      py::dict zipped;
      zipped["parts"] = parts;
      rows.append(zipped);
    }
    return rows;
  }
  std::uint64_t steps_given() const { return lineage_first_ + lineage_.size(); }

  // What the loop was given, with the record counts of the files read to their end.
  DeliveryLedger ledger_now() const {
    DeliveryLedger now = ledger_;
    if (engine_) now.merge(engine_->delivery_ledger(false));
    else now.merge(files_read_at_end_);
    now.set_run_ended(!engine_ && state_ == "finished");
    return now;
  }
  // The ledger as bytes, for the next run of the pipeline (its next epoch) to go on with.
  py::bytes ledger_bytes() const {
    checkpoint::Ledger message;
    ledger_now().save(message);
    return py::bytes(message.SerializeAsString());
  }
  py::list ledger() const {
    if (!follows_lineage_) throw py::value_error("ledger(): this pipeline does not follow lineage; make it with lineage=True");
    return verdicts_to_python(ledger_now().verdicts());
  }

 private:
  // The pipeline as this worker runs it (sluice/core/prepare.hpp): after the iterator took the
  // sink's place, whose output path then is not written, this worker's shard (or seed) of a job of
  // several, as `sluice run` makes it. Raises SpecError or ValueError, its queue forgotten.
  // With `select`, the sink is handed only that step of the first epoch (select_step).
  PreparedPipeline prepare(const std::string& text, const std::string& file, PrepareOptions options, Registry& registry,
                           bool iterate, const std::string& output, std::optional<std::uint64_t> select = std::nullopt) {
    PipelineDocument written;
    try {
      written = parse_pipeline(text, file);
    } catch (const SpecError& e) {
      raise_spec_error(e);
    }
    if (iterate)
      options.adapt = [&](PipelineDocument& doc) {
        if (spec::Stage* sink = attach_iterator(doc, registry, feed_stage_, output, true)) {
          queue_stage(*sink);
          iterator_id_ = sink->id();
        }
        if (select) select_step(doc, registry, *select);
      };
    try {
      PreparedPipeline prepared = prepare_pipeline(std::move(written), registry, options);
      for (const auto& warning : prepared.plan.warnings) std::fprintf(stderr, "sluice: warning: %s\n", printable(warning).c_str());
      spec_ = prepared.doc.spec;
      return prepared;
    } catch (const SpecError& e) {
      forget_queue();
      raise_spec_error(e);
    } catch (const WorkerIdentityError& e) {
      forget_queue();
      throw py::value_error(e.what());
    } catch (const Error& e) {  // (select_step)
      forget_queue();
      throw py::value_error(e.what());
    }
  }

  // Why `graph` cannot make a step directly (Engine::why_not_replayed_directly), asked of an
  // engine that is never started.
  static std::string why_not_replayed_directly(const Graph& graph, std::uint64_t first_epoch) {
    EngineOptions options;
    options.first_epoch = first_epoch;
    try {
      return Engine(Graph(graph), options).why_not_replayed_directly();
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  void queue_stage(spec::Stage& stage) {
    queue_ = std::make_shared<ElementQueue>(2);
    queue_handle_ = "queue:" + std::to_string(g_next_handle++);
    register_element_queue(queue_handle_, queue_);
    (*stage.mutable_params())["queue"] = queue_handle_;
  }
  void forget_queue() {
    if (queue_handle_.empty()) return;
    forget_element_queue(queue_handle_);
    queue_handle_.clear();
  }

  // Ctrl-C and other signals reach the training loop while it waits for the engine: the run
  // stops (its threads joined, or abandoned after kStopPatience if stuck in a Python call) and
  // the signal's exception goes on.
  void stop_if_interrupted() {
    if (PyErr_CheckSignals() == 0) return;
    py::error_already_set interrupted;
    close(kStopPatienceSeconds);
    throw interrupted;
  }

  // close()'s work, without the GIL: stop, then wait for the threads (all of them, or for
  // `patience` seconds and then leave behind the ones that do not end).
  void stop_and_join(std::optional<double> patience) {
    engine_->stop();
    if (queue_) queue_->cancel();
    if (patience && !engine_->wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(*patience)))) {
      abandon(*patience);
      return;
    }
    if (watcher_.joinable()) watcher_.join();
    if (cut_in_flight_.valid()) cut_in_flight_.wait();  // a stopped engine ends it
    result_ = engine_->wait();
    final_ = engine_->snapshot();
    if (follows_lineage_) files_read_at_end_ = engine_->delivery_ledger(false);
  }
  // The engine's threads did not end after the stop: it and everything that waits on it (the
  // watcher, a cut in flight) are kept, never destroyed, so that nothing here blocks on them.
  void abandon(double patience) {
    struct LeftBehind {
      std::shared_ptr<Engine> engine;
      std::thread watcher;
      std::future<std::optional<checkpoint::Checkpoint>> cut;
      std::shared_ptr<ElementQueue> queue;
    };
    auto* left = new LeftBehind{engine_, std::move(watcher_), std::move(cut_in_flight_), queue_};
    if (left->watcher.joinable()) left->watcher.detach();
    const std::string inside = python_calls_now();
    std::fprintf(stderr,
                 "sluice: the run did not stop within %.0f s: %s; its threads are left behind (they end with the process)\n",
                 patience, inside.empty() ? "a stage is inside a call that does not return" : (inside + " has not returned").c_str());
    final_ = engine_->snapshot();
    result_ = RunResult{};
    result_.state = RunState::Stopped;
  }
  [[noreturn]] void end_of_run() {
    finish_and_raise();
    throw py::stop_iteration();
  }

  void finish_and_raise() {
    close();
    if (result_.state == RunState::Failed) raise_pipeline_error(result_.error, result_.failed_stage);
  }

  // One step of a feed sink: a list with one dict of DlTensor per device, in device order. Each
  // slice's slot goes back to the feed when the last tensor made from it is dropped.
  py::object next_feed_step() {
    // Held here: another thread's close() may let go of the members while this one waits.
    const std::shared_ptr<Engine> engine = engine_;
    Feed* const feed = feed_;
    const int devices = feed->devices();
    py::list step;
    for (int d = 0; d < devices; ++d) {
      FeedSlice slice;
      for (;;) {
        const FeedStatus status = without_gil([&] { return feed->next(d, slice, std::chrono::milliseconds(100)); });
        if (status == FeedStatus::Ready) break;
        if (status == FeedStatus::End || status == FeedStatus::Stopped) end_of_run();
        stop_if_interrupted();
      }
      auto slot = std::make_shared<FeedSlot>();
      slot->feed = feed;
      slot->slice = slice;
      slot->owner = engine;
      // Emulated devices have no stream to wait on: their copies are waited for here. A CUDA
      // slice is waited for where it is read (make_ready).
      if (!slice.ready_event) slot->make_ready(std::nullopt);
      py::dict fields;
      for (const auto& f : slice.fields)
        fields[py::str(f.name)] = py::cast(DlTensor{nullptr, slot, f.data, f.dtype, f.shape, feed->emulated() ? kDLCPU : kDLCUDA,
                                                    feed->emulated() ? 0 : slice.ordinal});
      fields["valid_rows"] = slice.valid_rows;
      step.append(fields);
    }
    return step;
  }

  static constexpr double kStopPatienceSeconds = 2;  // as `sluice run` after a Ctrl-C
  std::mutex close_mutex_;
  bool closed_ = false;
  std::unique_ptr<MetricsServer> server_;
  // Shared with the slots of feed slices Python still holds: their memory is the feed's, freed
  // with the engine, so the engine (stopped and joined by close()) lives until the last is dropped.
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<ElementQueue> queue_;
  std::thread watcher_;  // closes queue_ once the engine's workers are done
  std::string queue_handle_, feed_stage_;
  Feed* feed_ = nullptr;
  spec::PipelineSpec spec_;
  RunResult result_;
  std::string state_ = "created";
  metrics::MetricsSnapshot final_;  // the run's last snapshot, once closed
  // Checkpoints (see checkpoint()): where this run began (a state it resumed, or its epoch's start),
  // the outputs its sink gave that were taken (by the loop, or dropped as taken before the state),
  // those still to drop, and the engine's cuts with how many outputs came before each.
  struct Cut {
    checkpoint::Checkpoint state;
    std::uint64_t outputs_before = 0;
  };
  void collect_finished_cut() {
    if (!cut_in_flight_.valid() || cut_in_flight_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
    std::optional<checkpoint::Checkpoint> taken;
    try {
      taken = cut_in_flight_.get();
    } catch (const std::exception&) {
      return;  // the run ended meanwhile; a stage that could not save fails the run, said by next()
    }
    if (!taken) return;
    // What the iterator's sink had taken in this run (other sinks of a tee run too).
    std::uint64_t before = 0;
    for (const auto& stage : taken->stages())
      if (stage.id() == iterator_id_) before = stage.elements_in();
    cuts_.push_back({std::move(*taken), before});
    // The latest cut the loop has gone past and those after it, which it reaches soon (a cut is
    // complete once its barrier reached the iterator's sink, at most its queue ahead of the loop).
    while (cuts_.size() > 1 && cuts_[1].outputs_before <= consumed_) cuts_.erase(cuts_.begin());
  }
  void ask_for_cut() {
    if (cut_in_flight_.valid() || engine_->wait_for(std::chrono::milliseconds(0))) return;
    cut_in_flight_ = std::async(std::launch::async, [engine = engine_] { return engine->checkpoint(false); });
  }
  // The records of each output the loop took (by output number, from taken_first_), for states
  // that a job of another number of workers continues; at most kMostTakenRows rows are kept.
  static constexpr std::size_t kMostTakenRows = std::size_t{1} << 22;
  struct TakenRow {
    std::shared_ptr<const std::string> where;
    std::int64_t record = -1;
  };
  void keep_rows_of(const Sample& output) {
    std::vector<TakenRow> rows;
    const Origin& origin = output.shared_origin();
    if (const auto* stacked = records_carried(origin); stacked && !stacked->parts) {
      rows.reserve(stacked->records.size());
      for (const Origin& row : stacked->records) rows.push_back({row.where, row.record});
    } else {
      rows.push_back({origin.where, origin.record});
    }
    taken_row_count_ += rows.size();
    taken_rows_.push_back(std::move(rows));
    // Those before the latest cut behind the loop are never named again; past the bound, the oldest go.
    std::uint64_t needed_from = taken_first_;
    for (const auto& cut : cuts_)
      if (cut.outputs_before <= consumed_) needed_from = std::max(needed_from, cut.outputs_before);
    while (!taken_rows_.empty() && (taken_first_ < needed_from || taken_row_count_ > kMostTakenRows)) {
      taken_row_count_ -= taken_rows_.front().size();
      taken_rows_.pop_front();
      ++taken_first_;
    }
  }
  // A state of a run's start is this worker's: its stages and parameters are this run's.
  // (A sink's parameters, its output, may change.)
  static void check_same_worker(const checkpoint::Checkpoint& state, const checkpoint::Checkpoint& now, Registry& registry) {
    for (int i = 0; i < std::min(state.stages_identity_size(), now.stages_identity_size()); ++i) {
      const auto op = registry.find(now.stages_identity(i).op());
      if (op && op->info.kind == OperatorKind::Sink) continue;
      if (state.stages_identity(i).params() != now.stages_identity(i).params())
        throw Error(fmt::format("the state was taken by another worker of a job, or of another pipeline: stage '{}' had parameters\n{}here "
                                "they are\n{}resume each worker from its own state, or give every worker the states of all",
                                now.stages_identity(i).id(), state.stages_identity(i).params(), now.stages_identity(i).params()));
    }
    if (state.stages_identity_size() != now.stages_identity_size())
      throw Error(fmt::format("the state is of another pipeline: it has {} stages, this one {}", state.stages_identity_size(), now.stages_identity_size()));
  }
  // Writes into `state` the records of the outputs the loop took from output `from` on.
  void name_taken_records(checkpoint::Checkpoint& state, std::uint64_t from) const {
    state.set_taken_known(false);
    state.clear_taken_files();  // (those of the state this run began from)
    state.clear_taken_file();
    state.clear_taken_record();
    if (!follows_rows_ || from < taken_first_ || from + state.outputs_to_skip() > taken_first_ + taken_rows_.size()) return;
    std::unordered_map<const std::string*, std::uint32_t> files;
    for (std::uint64_t k = from - taken_first_; k < from - taken_first_ + state.outputs_to_skip(); ++k)
      for (const TakenRow& row : taken_rows_[k]) {
        if (!row.where || row.record < 0) {  // an output not made of records: which ones it held is unknown
          state.clear_taken_files();
          state.clear_taken_file();
          state.clear_taken_record();
          return;
        }
        auto file = files.find(row.where.get());
        if (file == files.end()) {
          file = files.emplace(row.where.get(), static_cast<std::uint32_t>(state.taken_files_size())).first;
          state.add_taken_files(*row.where);
        }
        state.add_taken_file(file->second);
        state.add_taken_record(row.record);
      }
    state.set_taken_known(true);
  }

  // Lineage: the origins of the last outputs given to the loop, which carry their records.
  static constexpr std::size_t kLineageKept = 4096;
  void keep_lineage_of(const Sample& output) {
    ledger_.deliver(output.shared_origin());
    lineage_.push_back(output.shared_origin());
    if (lineage_.size() > kLineageKept) {
      lineage_.pop_front();
      ++lineage_first_;
    }
  }
  // What the loop was given, epoch by epoch: a resumed run's starts as its state's (whose loop had
  // taken the outputs this one drops); the first worker of a job continuing another job's states
  // starts with all of theirs.
  void start_ledger(const checkpoint::Checkpoint* resumed, const std::vector<std::shared_ptr<const checkpoint::Checkpoint>>& job,
                    std::int64_t worker_index) {
    // (A state of a run that continued a job already holds what its job's states held.)
    if (resumed && resumed->has_ledger()) {
      ledger_ = DeliveryLedger::load(resumed->ledger(), job.empty() ? "the state given to load_state_dict()" : "this worker's state");
      return;
    }
    if (worker_index != 0) return;
    for (std::size_t w = 0; w < job.size(); ++w)
      if (job[w]->has_ledger()) ledger_.merge(DeliveryLedger::load(job[w]->ledger(), fmt::format("the state of worker {} of {}", w, job.size())));
  }
  bool follows_lineage_ = false;
  std::string replay_why_;
  DeliveryLedger ledger_, files_read_at_end_;
  std::deque<Origin> lineage_;
  std::uint64_t lineage_first_ = 0;

  checkpoint::Checkpoint base_;
  std::vector<std::string> continued_job_;  // the states of another job this run continues
  bool follows_rows_ = false;  // its states name the records taken after the cut
  bool states_taken_ = false;  // state_dict() was called: a cut is kept under way
  std::deque<std::vector<TakenRow>> taken_rows_;
  std::uint64_t taken_first_ = 0;
  std::size_t taken_row_count_ = 0;
  std::string iterator_id_;
  std::uint64_t consumed_ = 0, drop_left_ = 0;
  std::vector<Cut> cuts_;
  std::future<std::optional<checkpoint::Checkpoint>> cut_in_flight_;
};

void bind_runner(py::module_& m) {
  py::class_<Runner>(m, "Runner")
      .def(py::init<const std::string&, const std::string&, const std::map<std::string, std::string>&, std::optional<std::uint64_t>,
                    const std::vector<std::string>&, const std::string&, bool, std::uint64_t, std::optional<int>, std::optional<int>,
                    const std::string&, const std::string&, const std::vector<std::string>&, bool, const std::vector<std::string>&,
                    std::optional<std::uint64_t>>(),
           py::arg("text"), py::arg("file"), py::arg("sets"), py::arg("seed"), py::arg("plugin_dirs"), py::arg("metrics_addr"),
           py::arg("iterate"), py::arg("first_epoch") = 0, py::arg("worker_index") = std::nullopt,
           py::arg("num_workers") = std::nullopt, py::arg("output") = "", py::arg("resume") = "",
           py::arg("resume_job") = std::vector<std::string>{}, py::arg("lineage") = false, py::arg("ledgers") = std::vector<std::string>{},
           py::arg("replay_step") = std::nullopt)
      .def("next", &Runner::next, py::arg("arrays") = true)
      .def("checkpoint", &Runner::checkpoint)
      .def("lineage", &Runner::lineage, py::arg("step"))
      .def("ledger", &Runner::ledger)
      .def("ledger_bytes", &Runner::ledger_bytes)
      .def_property_readonly("replay_why", &Runner::replay_why)
      .def_property_readonly("steps_given", &Runner::steps_given)
      .def_property_readonly("running", &Runner::running)
      .def("close", &Runner::close, py::arg("patience") = py::none())
      .def("run_to_end", &Runner::run_to_end)
      .def("snapshot", &Runner::snapshot)
      .def("report", &Runner::report)
      .def("spec_text", &Runner::spec_text)
      .def_property_readonly("metrics_url", &Runner::metrics_url);
}

}  // namespace sluice::python
