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

void Engine::Impl::attach_resume_on_other_workers() {
  const std::size_t workers = resume_workers.size();
  const std::string job = fmt::format("a checkpoint of {} workers", workers);
  const std::string resume_as_taken = fmt::format("resume it on {} workers, as it was taken", workers);
  // Which stages a split can carry over: the one source that splits an order by position, stateless
  // maps and filters, aggregates that hold nothing but elements, and sinks.
  for (auto& st : stages) {
    if (st->source) {
      if (!dynamic_cast<ResumesOnOtherWorkers*>(st->op.get()))
        throw Error(fmt::format("{} cannot continue on another number of workers: {} reads its data in its own order, which "
                                "another number of workers would split differently; {} (random_access splits one order by position)",
                                job, stage_label(*st), resume_as_taken));
      if (resharded_source)
        throw Error(fmt::format("{} cannot continue on another number of workers: the pipeline has two sources ({} and {}); {}", job,
                                stage_label(*resharded_source), stage_label(*st), resume_as_taken));
      resharded_source = st.get();
      continue;
    }
    if (st->sink || ((st->map || st->filter) && st->spec->op->info.traits.stateless)) continue;
    if (st->aggregate && dynamic_cast<HoldsOnlyElements*>(st->op.get())) continue;
    throw Error(fmt::format("{} cannot continue on another number of workers: {} keeps state of its own, which cannot be split "
                            "among other workers; {}",
                            job, stage_label(*st), resume_as_taken));
  }
  if (!resharded_source) throw Error(fmt::format("{} cannot continue here: this pipeline has no source", job));

  for (std::size_t w = 0; w < workers; ++w) {
    const checkpoint::Checkpoint& c = *resume_workers[w];
    const std::string whose = fmt::format("the checkpoint of worker {} of {}", w, workers);
    if (c.seed() != graph.seed)
      throw Error(fmt::format("{} was taken with seed {}, this run's seed is {}: resume with the same seed", whose, c.seed(), graph.seed));
    if (c.stages_size() == 0 || static_cast<std::size_t>(c.stages_size()) != stages.size() ||
        static_cast<std::size_t>(c.stages_identity_size()) != stages.size())
      throw Error(fmt::format("{} is of another pipeline: it has {} stages, this one {}", whose, c.stages_identity_size(), stages.size()));
    if (c.first_epoch() != resume_workers.front()->first_epoch())
      throw Error(fmt::format("{} starts at epoch {}, worker 0's at {}: the files are of different runs", whose, c.first_epoch(),
                              resume_workers.front()->first_epoch()));
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const StageRuntime& st = *stages[i];
      const auto& was = c.stages_identity(static_cast<int>(i));
      if (was.id() != st.spec->id || was.op() != st.spec->op->info.name || c.stages(static_cast<int>(i)).id() != st.spec->id)
        throw Error(fmt::format("{} is of another pipeline: its stage {} is '{}' ({}), here it is '{}' ({})", whose, i + 1, was.id(), was.op(),
                                st.spec->id, st.spec->op->info.name));
      const std::string now = params_text(*st.spec);
      if (st.sink) {
        // This run's output may not be one of theirs: publishing it would replace what they wrote.
        if (!c.stages(static_cast<int>(i)).operator_state().empty() && was.params() == now)
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
  gather_held_at_cut();
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
// buffer), and those made but not yet taken (a Python iterator's): by where they were read.
void Engine::Impl::gather_held_at_cut() {
  const std::size_t workers = resume_workers.size();
  auto hold = [&](const checkpoint::Element& element, const std::string& holder, std::size_t w) {
    if (!element.has_value())
      throw Error(fmt::format("{} of worker {} of {} names an element by reference, which cannot be given back: resume on {} workers", holder,
                              w, workers, workers));
    const Sample sample = decode_element(element.value(), fmt::format("an element {} held", holder));
    const Origin& origin = sample.shared_origin();
    if (!origin.where || origin.record < 0)
      throw Error(fmt::format("{} of worker {} of {} held an element made of several records (or of none), which cannot be given back to "
                              "the source record by record; resume on {} workers, as the checkpoint was taken",
                              holder, w, workers, workers));
    held_at_cut.push_back({*origin.where, origin.record});
  };
  for (std::size_t w = 0; w < workers; ++w) {
    const checkpoint::Checkpoint& c = *resume_workers[w];
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const StageRuntime& st = *stages[i];
      if (&st == resharded_source || st.sink) continue;
      for (const auto& element : c.stages(static_cast<int>(i)).elements()) hold(element, stage_label(st), w);
    }
    for (const auto& element : c.undelivered()) hold(element, "the elements made and not yet taken", w);
  }
}

void Engine::Impl::restore_on_other_workers() {
  if (resume_workers.empty()) return;
  const int source = static_cast<int>(std::find_if(stages.begin(), stages.end(), [&](const auto& st) { return st.get() == resharded_source; }) -
                                      stages.begin());
  std::vector<std::unique_ptr<CheckpointStateReader>> readers;
  std::vector<StateReader*> saved;
  for (std::size_t w = 0; w < resume_workers.size(); ++w) {
    const checkpoint::StageState& state = resume_workers[w]->stages(source);
    if (state.operator_state().empty()) {  // it had ended before the cut
      saved.push_back(nullptr);
      continue;
    }
    readers.push_back(std::make_unique<CheckpointStateReader>(
        state, state.operator_state(), fmt::format("stage '{}' of worker {} of {}", resharded_source->spec->id, w, resume_workers.size())));
    saved.push_back(readers.back().get());
  }
  dynamic_cast<ResumesOnOtherWorkers&>(*resharded_source->op).restore_on_other_workers(saved, held_at_cut, options.worker_count, options.worker_index);
  publish_outputs_of_earlier_workers();
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
      const checkpoint::StageState& state = c.stages(static_cast<int>(i));
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

}  // namespace sluice
