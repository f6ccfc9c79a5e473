// Resuming a job's checkpoint on another number of workers (EngineOptions::resume_workers).
//
// Worker w of N read positions w, w + N, w + 2N... of one order that every worker computes alike
// (a random_access source); its checkpoint says how many it had read, and its later stages' saved
// states name the ones that had not reached the sinks yet. So the positions no worker delivered
// are known, and M workers can split them anew, each taking every M-th: nothing lost, nothing
// given twice. The stages after the source start empty, the elements they held given back to the
// source; a stage whose state is more than the elements it holds (a take's count, an interleave's
// open files) cannot be split so, and the resume is refused naming it.
#include "engine_impl.hpp"
#include "sluice/core/param_parse.hpp"

namespace sluice {
namespace {

std::vector<std::pair<std::string, std::string>> param_lines(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    if (const auto equals = line.find('='); equals != std::string::npos) out.emplace_back(line.substr(0, equals), line.substr(equals + 1));
    at = end + 1;
  }
  return out;
}

// Where a sink writes: its output parameters, "path=out-0.jsonl".
std::string outputs_of(const GraphStage& spec) {
  std::string out;
  for (const auto& p : spec.op->info.params)
    if (auto v = spec.params.values().find(p.name); p.type == ParamType::OutputPath && v != spec.params.values().end()) out += (out.empty() ? "" : ", ") + p.name + "=" + format_param(v->second);
  return out;
}

}  // namespace

// A stage's parameter lines less those a worker's identity fills (a source's shard and count).
std::string params_of_any_worker(const GraphStage& spec, const std::string& text) {
  std::string out;
  for (const auto& line : param_lines(text)) {
    const auto& schema = spec.op->info.params;
    const auto p = std::find_if(schema.begin(), schema.end(), [&](const ParamSpec& s) { return s.name == line.first; });
    if (p != schema.end() && p->hint_role == ParamSpec::HintRole::Takes && (p->hint == "worker_index" || p->hint == "num_workers")) continue;
    out += line.first + '=' + line.second + '\n';
  }
  return out;
}

// Which stages a split can carry over: the one source that splits an order by position, stateless
// maps and filters, aggregates that hold nothing but elements of one record each, and sinks.
std::string Engine::Impl::why_not_on_other_workers(StageRuntime** split_source, const std::string& job, const std::string& resume_as_taken) const {
  StageRuntime* source = nullptr;
  // Whether a stage's elements may be batches (a stacking aggregate before it): a stage holding
  // those at a cut could not give them back record by record.
  std::vector<int> after_stacking(stages.size(), -1);
  std::function<bool(std::size_t)> batches_reach = [&](std::size_t i) {
    if (after_stacking[i] < 0) {
      after_stacking[i] = 0;
      for (int input : stages[i]->spec->inputs)
        if (dynamic_cast<StacksItsInputs*>(stages[static_cast<std::size_t>(input)]->op.get()) || batches_reach(static_cast<std::size_t>(input)))
          after_stacking[i] = 1;
    }
    return after_stacking[i] == 1;
  };
  for (std::size_t i = 0; i < stages.size(); ++i) {
    StageRuntime* st = stages[i].get();
    if (st->source) {
      if (!dynamic_cast<ResumesOnOtherWorkers*>(st->op.get()))
        return fmt::format("{} cannot continue on another number of workers: {} reads its data in its own order, which another number "
                           "of workers would split differently; {} (random_access splits one order by position)",
                           job, stage_label(*st), resume_as_taken);
      if (source)
        return fmt::format("{} cannot continue on another number of workers: the pipeline has two sources ({} and {}); {}", job,
                           stage_label(*source), stage_label(*st), resume_as_taken);
      source = st;
      continue;
    }
    if (st->sink || ((st->map || st->filter) && st->spec->op->info.traits.stateless)) continue;
    if (st->aggregate && dynamic_cast<HoldsOnlyElements*>(st->op.get())) {
      if (!batches_reach(i)) continue;
      return fmt::format("{} cannot continue on another number of workers: {} holds batches (it comes after a batching stage), which "
                         "cannot be given back to the source record by record; {}",
                         job, stage_label(*st), resume_as_taken);
    }
    return fmt::format("{} cannot continue on another number of workers: {} keeps state of its own, which cannot be split among other "
                       "workers; {}",
                       job, stage_label(*st), resume_as_taken);
  }
  if (!source) return fmt::format("{} cannot continue here: this pipeline has no source", job);
  if (split_source) *split_source = source;
  return {};
}

void Engine::Impl::attach_resume_on_other_workers() {
  const std::size_t workers = resume_workers.size();
  const std::string job = fmt::format("a checkpoint of {} workers", workers);
  const std::string resume_as_taken = fmt::format("resume it on {} workers, as it was taken", workers);
  if (const std::string why = why_not_on_other_workers(&resharded_source, job, resume_as_taken); !why.empty()) throw Error(why);

  for (std::size_t w = 0; w < workers; ++w) {
    const checkpoint::Checkpoint& c = *resume_workers[w];
    const std::string whose = fmt::format("the checkpoint of worker {} of {}", w, workers);
    if (c.seed() != graph.seed)
      throw Error(fmt::format("{} was taken with seed {}, this run's seed is {}: resume with the same seed", whose, c.seed(), graph.seed));
    // A Python state taken before its run's first cut is its run's start and the outputs since.
    const bool at_start = c.python_state() && c.stages_size() == 0 && !c.run_ended();
    if ((c.stages_size() == 0 && !at_start) || (!at_start && static_cast<std::size_t>(c.stages_size()) != stages.size()) ||
        static_cast<std::size_t>(c.stages_identity_size()) != stages.size())
      throw Error(fmt::format("{} is of another pipeline: it has {} stages, this one {}", whose, c.stages_identity_size(), stages.size()));
    if (c.first_epoch() != resume_workers.front()->first_epoch())
      throw Error(fmt::format("{} starts at epoch {}, worker 0's at {}: the files are of different runs", whose, c.first_epoch(),
                              resume_workers.front()->first_epoch()));
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const StageRuntime& st = *stages[i];
      const auto& was = c.stages_identity(static_cast<int>(i));
      if (was.id() != st.spec->id || was.op() != st.spec->op->info.name || (!at_start && c.stages(static_cast<int>(i)).id() != st.spec->id))
        throw Error(fmt::format("{} is of another pipeline: its stage {} is '{}' ({}), here it is '{}' ({})", whose, i + 1, was.id(), was.op(),
                                st.spec->id, st.spec->op->info.name));
      const std::string now = params_text(*st.spec);
      if (st.sink) {
        // This run's output may not be one of theirs: publishing it would replace what they wrote.
        if (!at_start && !c.stages(static_cast<int>(i)).operator_state().empty() && was.params() == now)
          throw Error(fmt::format("{} would write the output worker {} of {} wrote before the cut ({}); give the resumed workers "
                                  "outputs of their own, e.g. with {{num_workers}} in the path",
                                  stage_label(st), w, workers, outputs_of(*st.spec)));
        continue;
      }
      if (const std::string diff = first_difference(params_of_any_worker(*st.spec, was.params()), params_of_any_worker(*st.spec, now)); !diff.empty())
        throw Error(fmt::format("{} is of another pipeline: stage '{}' has {}; only the sinks' parameters may change", whose, st.spec->id, diff));
    }
  }
  options.first_epoch = resume_workers.front()->first_epoch();
  gather_held_at_cut(resume_workers, held_at_cut, taken_after_cut);
  // The source goes on inside its pass, before its first element there (it knows its place).
  std::string positions, summary;
  CheckpointStateWriter writer(resharded_source_positions, positions, summary);
  writer.put<std::uint64_t>(0);
  writer.put<std::uint64_t>(0);
  writer.put<std::uint8_t>(1);
  resharded_source_positions.set_id(resharded_source->spec->id);
  resharded_source_positions.set_op(resharded_source->spec->op->info.name);
  resharded_source_positions.set_engine_state(positions);
  resharded_source->restore = &resharded_source_positions;
}

// Every element a stage after the source held at the cut (a batch being gathered, a shuffle
// buffer), and those made but not yet taken: by where they were read. A Python state also names
// the records its loop took after the cut: those it held are not given back, and those read
// after it are told to the source as delivered.
void Engine::Impl::gather_held_at_cut(const std::vector<std::shared_ptr<const checkpoint::Checkpoint>>& job,
                                      std::vector<ResumesOnOtherWorkers::Held>& held_at_cut,
                                      std::vector<ResumesOnOtherWorkers::Held>& taken_after_cut) const {
  const std::size_t workers = job.size();
  std::map<std::pair<std::string, std::int64_t>, std::size_t> held_count;
  // (`state`: the holder's, whose read inputs its references name)
  std::map<const checkpoint::ReadInput*, std::optional<std::string>> files;  // each read input decoded once
  auto hold = [&](const checkpoint::Element& element, const std::string& holder, std::size_t w, const checkpoint::StageState* state) {
    if (element.has_ref()) {
      const auto& ref = element.ref();
      std::optional<std::string> file;
      if (state && ref.input() < static_cast<std::uint32_t>(state->read_inputs_size())) {
        const auto& input = state->read_inputs(static_cast<int>(ref.input()));
        auto known = files.find(&input);
        if (known == files.end()) known = files.emplace(&input, file_read_again(input, fmt::format("an element {} held", holder))).first;
        file = known->second;
      }
      if (!file)  // (an interleave's input, not a source's file)
        throw Error(fmt::format("{} of worker {} of {} names an element by where an interleave read it, which cannot be given back to the "
                                "source: resume on {} workers", holder, w, workers, workers));
      ++held_count[{*file, ref.record()}];
      return;
    }
    const Sample sample = decode_sample(element.value(), fmt::format("an element {} held", holder));
    const Origin& origin = sample.shared_origin();
    if (!origin.where || origin.record < 0)
      throw Error(fmt::format("{} of worker {} of {} held an element made of several records (or of none), which cannot be given back to "
                              "the source record by record; resume on {} workers, as the checkpoint was taken",
                              holder, w, workers, workers));
    ++held_count[{*origin.where, origin.record}];
  };
  for (std::size_t w = 0; w < workers; ++w) {
    const checkpoint::Checkpoint& c = *job[w];
    for (std::size_t i = 0; i < static_cast<std::size_t>(c.stages_size()); ++i) {  // (none in a state of a run's start)
      const StageRuntime& st = *stages[i];
      if (&st == resharded_source || st.sink) continue;
      for (const auto& element : c.stages(static_cast<int>(i)).elements()) hold(element, stage_label(st), w, &c.stages(static_cast<int>(i)));
    }
    for (const auto& element : c.undelivered()) hold(element, "the elements made and not yet taken", w, nullptr);
  }
  for (std::size_t w = 0; w < workers; ++w) {
    const checkpoint::Checkpoint& c = *job[w];
    if (c.outputs_to_skip() == 0) continue;
    if (!c.taken_known())
      throw Error(fmt::format("the state of worker {} of {} was taken {} outputs after its pipeline's latest cut and does not say which "
                              "records they held (more than Sluice keeps, or a pipeline whose outputs it cannot follow back to their "
                              "records); resume it on {} workers, or take state_dict() more often",
                              w, workers, c.outputs_to_skip(), workers));
    if (c.taken_file_size() != c.taken_record_size())
      throw Error(fmt::format("the state of worker {} of {} is damaged: {} files for {} records taken", w, workers, c.taken_file_size(), c.taken_record_size()));
    for (int k = 0; k < c.taken_record_size(); ++k) {
      if (c.taken_file(k) >= static_cast<std::uint32_t>(c.taken_files_size()))
        throw Error(fmt::format("the state of worker {} of {} is damaged: a taken record names file {} of {}", w, workers, c.taken_file(k), c.taken_files_size()));
      std::pair<std::string, std::int64_t> record{c.taken_files(static_cast<int>(c.taken_file(k))), c.taken_record(k)};
      auto held = held_count.find(record);
      if (held != held_count.end() && held->second > 0) --held->second;  // held at the cut, taken since
      else taken_after_cut.push_back({std::move(record.first), record.second});
    }
  }
  for (const auto& [record, count] : held_count)
    for (std::size_t k = 0; k < count; ++k) held_at_cut.push_back({record.first, record.second});
}

void Engine::Impl::restore_on_other_workers() {
  if (resume_workers.empty()) return;
  split_source_of(resume_workers, *resharded_source->op, options.worker_count, options.worker_index);
  publish_outputs_of_earlier_workers();
}

// Restores `source` (this run's, or an earlier worker's copy) as worker `worker` of `workers` from
// the states of the job before: what each of its workers' sources had saved, the records they held
// and those taken after their cuts.
void Engine::Impl::split_source_of(const std::vector<std::shared_ptr<const checkpoint::Checkpoint>>& job, Operator& source, std::int64_t workers,
                                   std::int64_t worker) {
  std::vector<ResumesOnOtherWorkers::Held> held, taken;
  if (&source != resharded_source->op.get()) gather_held_at_cut(job, held, taken);
  const checkpoint::StageState no_elements;
  std::vector<std::optional<std::string>> states;
  std::vector<std::unique_ptr<CheckpointStateReader>> readers;
  std::vector<StateReader*> saved;
  for (std::size_t w = 0; w < job.size(); ++w) states.push_back(source_state_of(*job[w], job.size(), w));
  for (std::size_t w = 0; w < job.size(); ++w) {
    if (!states[w]) {  // it had ended before the cut
      saved.push_back(nullptr);
      continue;
    }
    readers.push_back(std::make_unique<CheckpointStateReader>(no_elements, *states[w],
                                                              fmt::format("stage '{}' of worker {} of {}", resharded_source->spec->id, w, job.size())));
    saved.push_back(readers.back().get());
  }
  auto& splits = dynamic_cast<ResumesOnOtherWorkers&>(source);
  if (&source == resharded_source->op.get()) splits.restore_on_other_workers(saved, held_at_cut, taken_after_cut, workers, worker);
  else splits.restore_on_other_workers(saved, held, taken, workers, worker);
}

// What the source of worker `worker` of `workers` had saved at its state's cut (nullopt: it had
// ended). A Python state of its run's start has no cut: its source is made again as that run
// began, at the start of its epoch or, when that run continued the states of a job of another
// size, restored from those as it was.
std::optional<std::string> Engine::Impl::source_state_of(const checkpoint::Checkpoint& c, std::size_t workers, std::size_t worker) {
  const auto source = static_cast<int>(std::find_if(stages.begin(), stages.end(), [&](const auto& st) { return st.get() == resharded_source; }) -
                                       stages.begin());
  if (c.stages_size() > 0) {
    const std::string& state = c.stages(source).operator_state();
    if (state.empty()) return std::nullopt;
    return state;
  }
  const std::string what = fmt::format("stage '{}' of worker {} of {}", resharded_source->spec->id, worker, workers);
  try {
    const auto& info = resharded_source->spec->op->info;
    std::unique_ptr<Operator> earlier = info.create(parse_params(info.params, param_lines(c.stages_identity(source).params())));
    earlier->start(resharded_source->info);
    if (c.continued_job_size() == 0) {
      dynamic_cast<Source&>(*earlier).begin_pass(c.first_epoch());
    } else {
      const auto job = states_of_job({c.continued_job().begin(), c.continued_job().end()}, "that its run continued");
      split_source_of(job, *earlier, static_cast<std::int64_t>(workers), static_cast<std::int64_t>(worker));
    }
    checkpoint::StageState state;
    std::string bytes, summary;
    CheckpointStateWriter writer(state, bytes, summary);
    earlier->save_state(writer);
    earlier->finish(false);
    return bytes;
  } catch (const std::exception& e) {
    throw Error(fmt::format("{} could not be made as its run began (epoch {}): {}", what, c.first_epoch(), e.what()));
  }
}

// The outputs the earlier workers were writing at the cut, published as they stood then (a run
// stopped at its checkpoint had published them; one killed after it had left them partial): each
// by one of this job's workers, worker w's by worker w mod M.
void Engine::Impl::publish_outputs_of_earlier_workers() {
  const std::size_t workers = resume_workers.size();
  for (std::size_t w = 0; w < workers; ++w) {
    if (static_cast<std::int64_t>(w) % options.worker_count != options.worker_index) continue;
    const checkpoint::Checkpoint& c = *resume_workers[w];
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const StageRuntime& st = *stages[i];
      if (i >= static_cast<std::size_t>(c.stages_size())) break;  // a state of its run's start: nothing written yet
      const checkpoint::StageState& state = c.stages(static_cast<int>(i));
      // What it had delivered joins this worker's ledger (each earlier worker's, one later worker's).
      if (st.ledger && state.has_ledger())
        st.ledger->merge(DeliveryLedger::load(state.ledger(), fmt::format("the checkpoint of worker {} of {}", w, workers)));
      if (!st.sink || state.operator_state().empty()) continue;
      const std::string what = fmt::format("the output of {} of worker {} of {}", stage_label(st), w, workers);
      try {
        const auto& info = st.spec->op->info;
        std::unique_ptr<Operator> earlier = info.create(parse_params(info.params, param_lines(c.stages_identity(static_cast<int>(i)).params())));
        earlier->start(st.info);
        CheckpointStateReader reader(state, state.operator_state(), what);
        earlier->restore_state(reader);
        earlier->finish(true);
      } catch (const std::exception& e) {
        throw Error(fmt::format("{} could not be published as it stood at the cut: {}", what, e.what()));
      }
    }
  }
}

std::string Engine::why_not_on_other_workers() const {
  return impl_->why_not_on_other_workers(nullptr, "a checkpoint of this pipeline", "resume it on as many workers as took it");
}

}  // namespace sluice
