// Checkpoints of a running pipeline and resuming from them (see Engine::Impl::Cut).
//
// The cut: a checkpoint asks every stage that makes elements on its own (sources; an interleave,
// which reads its open inputs; an aggregate replaying a cache) to stop at an element boundary,
// save where it is and hand on a barrier. Every other stage saves its state when the barrier
// reaches it, after the elements before it: an aggregate (shuffle, batch) the elements it holds,
// an ordered parallel stage its position once earlier chunks are committed. In deterministic runs
// every element before a barrier is in the state of the stage that took it, and none after, so
// the saved states fit together, and a resumed run makes exactly what the interrupted one would
// have made next.
#include <chrono>

#include "engine_impl.hpp"
#include "sluice/core/param_parse.hpp"

namespace sluice {

// A stage's parameters as checkpoints keep them: "name=value" lines.
std::string params_text(const GraphStage& spec) {
  std::string text;
  for (const auto& [name, value] : spec.params.values()) text += name + '=' + format_param(value) + '\n';
  return text;
}

// The first line of `a` that `b` lacks, for "parameter x=1 was x=2".
std::string first_difference(const std::string& was, const std::string& now) {
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::size_t at = 0;
    while (at < text.size()) {
      const std::size_t end = text.find('\n', at);
      out.push_back(text.substr(at, end - at));
      at = end == std::string::npos ? text.size() : end + 1;
    }
    return out;
  };
  const auto a = lines(was), b = lines(now);
  for (const auto& line : a)
    if (std::find(b.begin(), b.end(), line) == b.end()) {
      const std::string name = line.substr(0, line.find('='));
      for (const auto& other : b)
        if (other.substr(0, other.find('=')) == name) return fmt::format("parameter {} (the checkpoint's run had {})", other, line);
      return fmt::format("parameter {} is gone", line);
    }
  for (const auto& line : b)
    if (std::find(a.begin(), a.end(), line) == a.end()) return fmt::format("parameter {} is new", line);
  return "";
}

namespace {

// Operators whose state the engine cannot see must save it themselves.
bool must_save_state(const OperatorInfo& info) {
  switch (info.kind) {
    case OperatorKind::Source:
    case OperatorKind::Aggregate:
    case OperatorKind::Combine: return true;
    case OperatorKind::Map:
    case OperatorKind::Filter: return !info.traits.stateless;
    case OperatorKind::Expand:
    case OperatorKind::Sink: return false;
  }
  return true;
}


}  // namespace

std::vector<std::string> Engine::checkpoint_refusals() const {
  const auto& I = *impl_;
  std::vector<std::string> out;
  if (!I.graph.deterministic)
    out.push_back("the pipeline runs with `deterministic: false`: its order depends on timing, so no saved position can be "
                  "continued exactly; set `deterministic: true` to checkpoint it");
  for (const auto& st : I.stages) {
    const auto& info = st->spec->op->info;
    // A stage's own `deterministic: false` (the pipeline's is said once, above).
    const bool keeps_order = st->expand ? st->spec->interleave_keeps_order(I.graph.deterministic) : st->spec->keeps_order(I.graph.deterministic);
    if (I.graph.deterministic && !keeps_order)
      out.push_back(fmt::format("{} {} in completion order (deterministic: false); make it deterministic to checkpoint",
                                I.stage_label(*st), st->expand ? "interleaves" : "hands its outputs on"));
    // A per-input stage's state is made again on resume, by reading its interleave's open inputs again.
    if (must_save_state(info) && !info.traits.saves_state && !st->spec->per_input)
      out.push_back(fmt::format("{} (from {}) keeps state between elements and cannot save it (its operator does not set "
                                "OperatorTraits::saves_state)",
                                I.stage_label(*st), st->spec->op->library_path));
  }
  return out;
}

checkpoint::Checkpoint Engine::start_state() const {
  const auto& I = *impl_;
  checkpoint::Checkpoint c;
  c.set_format(kCheckpointFormat);
  c.set_pipeline_file(I.graph.file);
  c.set_seed(I.graph.seed);
  c.set_first_epoch(I.options.first_epoch);
  c.set_created_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  for (const auto& st : I.stages) {
    auto* identity = c.add_stages_identity();
    identity->set_id(st->spec->id);
    identity->set_op(st->spec->op->info.name);
    identity->set_params(params_text(*st->spec));
    identity->set_output_fingerprint(st->output_fingerprint);
  }
  return c;
}

std::optional<checkpoint::Checkpoint> Engine::checkpoint(bool then_stop) {
  auto& I = *impl_;
  if (auto refusals = checkpoint_refusals(); !refusals.empty()) {
    std::string text = "this pipeline cannot be checkpointed:";
    for (const auto& r : refusals) text += "\n  " + r;
    throw Error(text);
  }
  if (I.state.load() != static_cast<int>(RunState::Running)) throw Error("checkpoint(): the engine is not running (start() it first)");
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lock(I.cut_mutex);
  if (I.cut) throw Error("checkpoint(): a checkpoint is already being taken");
  I.cut = std::make_unique<Impl::Cut>();
  I.cut->generation = ++I.cut_generations;
  I.cut->then_stop = then_stop;
  I.cut->states.resize(I.stages.size());
  I.cut_wanted.store(I.cut->generation);
  I.complete_cut_if_ready_locked();
  // Stages that wait for something (a pausing source blocked on a full buffer) are woken.
  for (auto& st : I.stages)
    if (st->output) st->output->wake_all();
  while (!I.cut->complete && !I.stopping.load()) I.cut_cv.wait_for(lock, std::chrono::milliseconds(50));
  std::unique_ptr<Impl::Cut> cut = std::move(I.cut);
  if (!cut->complete) {
    I.cut_wanted.store(0);
    I.cut_released.store(cut->generation);
    I.cut_cv.notify_all();
    return std::nullopt;
  }
  bool all_ended = true;
  for (auto& st : I.stages) all_ended &= st->ended.load();
  if (all_ended) {  // the run ended before the cut reached anything: nothing is left to continue
    I.cut_wanted.store(0);
    I.cut_released.store(cut->generation);
    I.cut_cv.notify_all();
    return std::nullopt;
  }
  checkpoint::Checkpoint c = start_state();
  std::uint64_t continued = I.resume ? I.resume->sequence() : 0;  // (a job resumed on other workers: the latest of theirs)
  for (const auto& earlier : I.resume_workers) continued = std::max(continued, earlier->sequence());
  c.set_sequence(continued + ++I.checkpoints_taken);
  for (std::size_t i = 0; i < I.stages.size(); ++i) {
    const auto& st = *I.stages[i];
    checkpoint::StageState state;
    if (cut->states[i]) {
      state = std::move(*cut->states[i]);
    } else {
      state.set_id(st.spec->id);
      state.set_op(st.spec->op->info.name);
      state.set_ended(true);
      // Its threads are done with it. What it saves still identifies its inputs (a file list's
      // files), so that a resumed run over other files is refused even after the list ended.
      if (st.spec->op->info.traits.saves_state) {
        std::string bytes, words;
        CheckpointStateWriter writer(state, bytes, words);
        try {
          st.op->save_state(writer);
        } catch (const std::exception& e) {
          lock.unlock();
          I.fail(fmt::format("{} could not save its state for a checkpoint: {}", I.stage_label(st), e.what()), &st);
          return std::nullopt;
        }
        state.set_operator_state(std::move(bytes));
        state.set_operator_summary(std::move(words));
      }
      I.save_ledger(st, state);
    }
    if (st.sink) c.set_sink_elements(c.sink_elements() + state.elements_in());  // in this run
    *c.add_stages() = std::move(state);
  }
  if (I.resume) c.set_sink_elements(c.sink_elements() + I.resume->sink_elements());
  if (then_stop) {
    I.stopped_at_checkpoint.store(true);
    lock.unlock();
    I.request_stop();
    lock.lock();
  }
  I.cut_wanted.store(0);
  I.cut_released.store(cut->generation);
  I.cut_cv.notify_all();
  lock.unlock();
  c.set_save_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return c;
}

bool Engine::Impl::save_stage(StageRuntime& st, const std::function<void(StateWriter&)>& engine, std::string summary,
                              std::uint64_t open_inputs_to_seek, const std::function<void(StateWriter&)>* operator_state,
                              const std::function<void(StateWriter&, std::size_t)>* member_positions) {
  const std::uint64_t generation = cut_wanted.load();
  if (generation == 0) return true;
  std::vector<StageRuntime*> members{&st};
  members.insert(members.end(), st.fused.begin(), st.fused.end());
  std::vector<checkpoint::StageState> states;
  for (std::size_t k = 0; k < members.size(); ++k) {
    StageRuntime* member = members[k];
    checkpoint::StageState state;
    state.set_id(member->spec->id);
    state.set_op(member->spec->op->info.name);
    state.set_elements_in(member->counters.elements_in.load());
    std::string engine_bytes, engine_words, op_bytes, op_words;
    CheckpointStateWriter engine_writer(state, engine_bytes, engine_words);
    if (k > 0 && member_positions) (*member_positions)(engine_writer, k);
    else engine(engine_writer);
    // A per-input member keeps its state in each open input's cursor: a resumed run reads those
    // inputs again up to where they were (the interleave's positions), which makes it again.
    if (member->spec->op->info.traits.saves_state && !member->spec->per_input) {
      std::unordered_map<const std::string*, std::uint32_t> inputs;
      CheckpointStateWriter op_writer(state, op_bytes, op_words, [&](const Sample& element, checkpoint::Element& out) {
        return refer_to(*member, element, state, inputs, out);
      });
      try {
        if (operator_state && member == &st) (*operator_state)(op_writer);
        else member->op->save_state(op_writer);
      } catch (const std::exception& e) {
        fail(fmt::format("{} could not save its state for a checkpoint: {}", stage_label(*member), e.what()), member);
        return false;
      }
    }
    state.set_engine_state(std::move(engine_bytes));
    state.set_operator_state(std::move(op_bytes));
    state.set_summary(summary);
    if (member == &st) state.set_open_inputs_to_seek(open_inputs_to_seek);
    save_ledger(*member, state);
    state.set_operator_summary(std::move(op_words));
    states.push_back(std::move(state));
  }
  std::lock_guard lock(cut_mutex);
  if (!cut || cut->generation != generation) return true;  // abandoned meanwhile
  for (std::size_t m = 0; m < members.size(); ++m) {
    members[m]->saved_cut = generation;
    const auto index = static_cast<std::size_t>(std::find_if(stages.begin(), stages.end(), [&](const auto& s) { return s.get() == members[m]; }) - stages.begin());
    cut->states[index] = std::move(states[m]);
  }
  complete_cut_if_ready_locked();
  return true;
}

void Engine::Impl::complete_cut_if_ready_locked() {
  if (!cut || cut->complete) return;
  for (std::size_t i = 0; i < stages.size(); ++i)
    if (!cut->states[i] && !stages[i]->ended.load()) return;
  cut->complete = true;
  cut_cv.notify_all();
}

// After a stage saved for a cut: a cut the run stops at holds it there, as nothing may be made past
// it; any other lets it go on at once, what it makes behind the barrier, so that a loop taking a
// state every few steps (Python's state_dict(), --checkpoint-every) keeps its pipeline running.
// Until 2026-11-30 every cut held the sources until it was complete: the pipeline drained at each,
// and a loop taking a state every 10 steps lost 40% of its images/s.
bool Engine::Impl::wait_for_release(const StageRuntime& st) {
  std::unique_lock lock(cut_mutex);
  if (cut && cut->generation == st.saved_cut && !cut->then_stop) return !stopping.load();
  while (cut_released.load() < st.saved_cut && !stopping.load()) cut_cv.wait_for(lock, std::chrono::milliseconds(50));
  return !stopping.load();
}

void Engine::Impl::stage_ended(StageRuntime& st) {
  st.ended.store(true);
  for (auto* member : st.fused) member->ended.store(true);
  std::lock_guard lock(cut_mutex);
  complete_cut_if_ready_locked();
}

void Engine::Impl::attach_resume_state() {
  const checkpoint::Checkpoint& c = *resume;
  const std::string file = c.pipeline_file().empty() ? "its pipeline" : c.pipeline_file();
  if (c.seed() != graph.seed)
    throw Error(fmt::format("the checkpoint was taken with seed {}, this run's seed is {}: resume with the same seed (set `seed: {}`)",
                            c.seed(), graph.seed, c.seed()));
  // A start_state(): the same pipeline is checked, and the run begins from the beginning.
  const bool at_the_start = c.stages_size() == 0 && c.stages_identity_size() > 0;
  if (static_cast<std::size_t>(c.stages_identity_size()) != stages.size() ||
      (!at_the_start && static_cast<std::size_t>(c.stages_size()) != stages.size())) {
    std::string ids;
    for (const auto& s : c.stages_identity()) ids += (ids.empty() ? "" : ", ") + s.id();
    throw Error(fmt::format("the checkpoint is of another pipeline ({}): it has {} stages ({}), this one {}", file,
                            c.stages_identity_size(), ids, stages.size()));
  }
  for (std::size_t i = 0; i < stages.size(); ++i) {
    auto& st = *stages[i];
    const auto& was = c.stages_identity(static_cast<int>(i));
    if (was.id() != st.spec->id || was.op() != st.spec->op->info.name)
      throw Error(fmt::format("the checkpoint is of another pipeline ({}): its stage {} is '{}' ({}), here it is '{}' ({})", file, i + 1,
                              was.id(), was.op(), st.spec->id, st.spec->op->info.name));
    if (st.sink) {
      if (!at_the_start) st.restore = &c.stages(static_cast<int>(i));
      continue;  // a sink's parameters (its output path) do not change the data
    }
    if (const std::string diff = first_difference(was.params(), params_text(*st.spec)); !diff.empty()) {
      if (params_of_any_worker(*st.spec, was.params()) == params_of_any_worker(*st.spec, params_text(*st.spec)))
        throw Error(fmt::format("the checkpoint was taken by another worker of a job: stage '{}' has {}; resume each worker from its own "
                                "checkpoint, or give a job of another number of workers the checkpoints of all of them (`sluice run "
                                "--resume FOLDER`; in Python, load_state_dict() with the list of every worker's state)",
                                st.spec->id, diff));
      throw Error(fmt::format("the checkpoint is of another pipeline ({}): stage '{}' has {}; only the sinks' parameters may change",
                              file, st.spec->id, diff));
    }
    if (was.output_fingerprint() != st.output_fingerprint)
      throw Error(fmt::format("the checkpoint is of another pipeline ({}): what reaches stage '{}' is made differently (an input "
                              "order or a parameter before it changed)", file, st.spec->id));
    if (at_the_start) continue;
    st.restore = &c.stages(static_cast<int>(i));
    if (st.restore->id() != st.spec->id) throw Error(fmt::format("the checkpoint is damaged: its state {} is for stage '{}', not '{}'", i + 1, st.restore->id(), st.spec->id));
  }
  options.first_epoch = c.first_epoch();
  if (at_the_start) resume.reset();  // nothing to continue: a fresh run at that epoch
}

bool Engine::Impl::end_if_ended_before(StageRuntime& st, std::vector<Item>& out) {
  if (!st.restore || !st.restore->ended()) return false;
  out.push_back(Item::end_of_stream());
  if (flush(st, out)) stage_ended(st);
  return true;
}

void Engine::Impl::put_item(StateWriter& w, const Item& item) {
  w.put<std::uint8_t>(static_cast<std::uint8_t>(item.kind));
  w.put(item.iteration);
  if (item.is_element()) w.put_element(item.sample);
}

Item Engine::Impl::get_item(StateReader& r) {
  const auto kind = static_cast<Item::Kind>(r.get<std::uint8_t>());
  const auto iteration = r.get<std::uint64_t>();
  switch (kind) {
    case Item::Kind::Element: return Item::element(r.get_element());
    case Item::Kind::EndOfIteration: return Item::end_of_iteration(iteration);
    case Item::Kind::EndOfStream: return Item::end_of_stream();
    case Item::Kind::Barrier: break;
  }
  throw DataError("the checkpoint's waiting inputs hold an unknown item: it is damaged");
}

std::unique_ptr<CheckpointStateReader> Engine::Impl::engine_state_reader(const StageRuntime& st) const {
  return std::make_unique<CheckpointStateReader>(*st.restore, st.restore->engine_state(), fmt::format("stage '{}' (engine positions)", st.spec->id));
}

// Stateless maps right before stage `at` (one input, not per input), nearest last; `at` becomes
// the stage before them.
std::vector<StageRuntime*> Engine::Impl::stateless_maps_before(int& at) const {
  std::vector<StageRuntime*> maps;
  // Not through a per-input map: its elements are not an interleave's records mapped one by one
  // with the contexts a reference could give again.
  while (stages[at]->map && stages[at]->spec->op->info.traits.stateless && stages[at]->spec->inputs.size() == 1 &&
         !stages[at]->spec->per_input) {
    maps.insert(maps.begin(), stages[at].get());
    at = stages[at]->spec->inputs[0];
  }
  return maps;
}

bool Engine::Impl::hands_on_its_inputs(int at) const {
  return dynamic_cast<HandsOnItsInputs*>(stages[at]->op.get()) && stages[at]->spec->inputs.size() == 1 && !stages[at]->spec->per_input;
}

void Engine::Impl::find_read_paths() {
  for (auto& st : stages) {
    if (!st->aggregate || st->spec->inputs.size() != 1 || st->spec->per_input) continue;
    int at = st->spec->inputs[0];
    StageRuntime* after_maps = st.get();
    // Maps after a stage that hands on its inputs (`shuffle -> map -> batch`): they saw the
    // places the elements had after it, which the holder remembers (InputPlaces).
    std::vector<StageRuntime*> made_maps = stateless_maps_before(at);
    if (made_maps.empty() || !hands_on_its_inputs(at)) {
      made_maps.clear();
      at = st->spec->inputs[0];
    }
    // Through stages right before it that hand on their inputs unchanged (a batch after a
    // shuffle): what it holds is still what was read and mapped.
    while (hands_on_its_inputs(at)) {
      after_maps = stages[at].get();
      at = stages[at]->spec->inputs[0];
    }
    std::vector<StageRuntime*> maps = stateless_maps_before(at);
    // Or through repeats to a source that reads its records again from their origins.
    int source = at;
    while (stages[source]->passes_through && stages[source]->spec->inputs.size() == 1 && !stages[source]->spec->per_input)
      source = stages[source]->spec->inputs[0];
    auto* rereads = stages[source]->source ? dynamic_cast<ReadsRecordsAgain*>(stages[source]->op.get()) : nullptr;
    if (rereads) {
      at = source;
      (maps.empty() ? after_maps : maps.front())->stamps_read_positions = true;
    } else if (!stages[at]->expand || !stages[at]->spec->interleave_keeps_order(graph.deterministic)) {
      continue;
    }
    st->reads_from = at;
    st->rereads = rereads;
    if (!maps.empty()) after_maps->checks_read_positions = true;
    st->maps_after_hand_on = made_maps.size();
    if (!made_maps.empty()) st->input_places = std::make_unique<InputPlaces>();
    maps.insert(maps.end(), made_maps.begin(), made_maps.end());
    st->maps_since_read = std::move(maps);
  }
}

// (made_places_hold_in) Whether the first map after the stage that hands on its inputs stood at the
// cut where `holder` stands, (epoch, index) of its input: then no map between dropped an element
// this epoch, and the places the holder remembers are those the maps saw.
bool Engine::Impl::made_places_hold_at_cut(const StageRuntime& holder, std::uint64_t epoch, std::uint64_t index) {
  if (holder.maps_after_hand_on == 0) return false;
  const StageRuntime& first = *holder.maps_since_read[holder.maps_since_read.size() - holder.maps_after_hand_on];
  const auto at = static_cast<std::size_t>(std::find_if(stages.begin(), stages.end(), [&](const auto& s) { return s.get() == &first; }) - stages.begin());
  std::lock_guard lock(cut_mutex);
  if (!cut || at >= cut->states.size() || !cut->states[at]) return false;
  const std::string& positions = cut->states[at]->engine_state();  // (ParallelStage: its input iteration and index)
  std::uint64_t iteration = 0, next = 0;
  if (positions.size() != sizeof iteration + sizeof next) return false;
  std::memcpy(&iteration, positions.data(), sizeof iteration);
  std::memcpy(&next, positions.data() + sizeof iteration, sizeof next);
  return first.first_input_epoch + iteration == epoch && next == index;
}

bool Engine::Impl::refer_to(StageRuntime& holder, const Sample& element, checkpoint::StageState& state,
                            std::unordered_map<const std::string*, std::uint32_t>& inputs, checkpoint::Element& out) {
  const Origin& origin = element.shared_origin();
  if (holder.reads_from < 0 || !origin.where || origin.record < 0 || origin.byte_offset < 0 || origin.read_index < 0) return false;
  std::optional<InputPlaces::Place> made;
  if (holder.input_places) {  // (held after maps after a shuffle: the place those maps saw)
    made = holder.input_places->find(origin);
    if (!made || made->epoch != holder.made_places_hold_in) return false;
  }
  StageRuntime& reader = *stages[holder.reads_from];
  auto known = inputs.find(origin.where.get());
  if (known == inputs.end() && holder.rereads) {  // a source's records: their file, by name
    auto* saved = state.add_read_inputs();
    saved->set_stage(reader.spec->id);
    Sample where;
    where.set(std::string(kReadAgainFrom), Tensor::from_string(*origin.where));
    saved->set_input(encode_sample(where));  // (file_read_again() reads it)
    known = inputs.emplace(origin.where.get(), static_cast<std::uint32_t>(state.read_inputs_size() - 1)).first;
  }
  if (known == inputs.end()) {
    StageRuntime::ReadInput input;
    {
      std::lock_guard lock(reader.read_inputs_mutex);
      auto it = reader.read_inputs.find(origin.where.get());
      // (An expired entry at this address was another origin's, whose memory this one reuses.)
      if (it == reader.read_inputs.end() || it->second.where.lock() != origin.where) return false;
      input = it->second;
    }
    auto* saved = state.add_read_inputs();
    saved->set_stage(reader.spec->id);
    saved->set_input(encode_sample(input.input));
    saved->set_epoch(input.epoch);
    saved->set_index(input.index);
    known = inputs.emplace(origin.where.get(), static_cast<std::uint32_t>(state.read_inputs_size() - 1)).first;
  }
  auto* ref = out.mutable_ref();
  ref->set_input(known->second);
  if (made) {
    ref->mutable_made()->set_epoch(made->epoch);
    ref->mutable_made()->set_index(made->index);
  }
  ref->set_record(origin.record);
  ref->set_byte_offset(origin.byte_offset);
  ref->set_epoch(origin.read_epoch);
  ref->set_index(static_cast<std::uint64_t>(origin.read_index));
  return true;
}

std::vector<Sample> Engine::Impl::read_referenced(StageRuntime& st) {
  const checkpoint::StageState& state = *st.restore;
  std::vector<Sample> out(static_cast<std::size_t>(state.elements_size()));
  std::vector<std::string> names(out.size());  // the input each was read from, for messages
  // By input, then in file order: each input is opened once and read forward.
  std::vector<int> refs;
  for (int i = 0; i < state.elements_size(); ++i)
    if (state.elements(i).has_ref()) refs.push_back(i);
  if (refs.empty()) return out;
  if (st.reads_from < 0)
    throw DataError("its saved state names elements by where they were read, but nothing before it reads them (the pipeline differs)");
  for (int number : refs)
    if (state.elements(number).ref().has_made() != (st.maps_after_hand_on > 0))
      throw DataError(fmt::format("its saved state names element {} {} the place it had after a shuffle, which the maps before it {} (the "
                                  "pipeline differs)", number, st.maps_after_hand_on > 0 ? "without" : "with",
                                  st.maps_after_hand_on > 0 ? "need" : "do not take"));
  std::sort(refs.begin(), refs.end(), [&](int a, int b) {
    const auto &x = state.elements(a).ref(), &y = state.elements(b).ref();
    return std::make_pair(x.input(), x.record()) < std::make_pair(y.input(), y.record());
  });
  if (st.rereads) {
    read_again(st, refs, out, names);
  } else {
    read_from_inputs(st, refs, out, names);
  }
  make_again(st, refs, out, names);
  if (st.input_places)  // a later cut names them again by the same places
    for (int number : refs) {
      const auto& made = state.elements(number).ref().made();
      st.input_places->remember(out[static_cast<std::size_t>(number)].shared_origin(), made.epoch(), made.index());
    }
  return out;
}

// The held elements a source gave (ReadsRecordsAgain): each read again from its file and record.
void Engine::Impl::read_again(StageRuntime& st, const std::vector<int>& refs, std::vector<Sample>& out, std::vector<std::string>& names) {
  const checkpoint::StageState& state = *st.restore;
  StageRuntime& reader = *stages[st.reads_from];
  std::vector<std::optional<std::string>> files(static_cast<std::size_t>(state.read_inputs_size()));
  for (int number : refs) {
    const auto& ref = state.elements(number).ref();
    const auto& input = checked_read_input(st, number);
    auto& where = files[ref.input()];
    if (!where) where = file_read_again(input, fmt::format("input {} of stage '{}'", ref.input(), reader.spec->id));
    if (!where) throw DataError(fmt::format("element {} names no file of stage '{}': the checkpoint is damaged", number, reader.spec->id));
    Sample element = st.rereads->read_again(*where, ref.record(), ref.byte_offset());
    add(reader.reread, 1);
    if (options.lineage) detail::stamp_read_epoch(element, ref.epoch());  // (a source's pass, as its first map saw it)
    element.set_read_position(ref.epoch(), static_cast<std::int64_t>(ref.index()));
    out[static_cast<std::size_t>(number)] = std::move(element);
    names[static_cast<std::size_t>(number)] = *where;
  }
}

// The file a read input of a source that reads again names (refer_to wrote it); none for an
// interleave's input.
std::optional<std::string> file_read_again(const checkpoint::ReadInput& input, const std::string& what) {
  const Sample named = decode_sample(input.input(), what);
  const Tensor* file = named.find(kReadAgainFrom);
  if (!file) return std::nullopt;
  return std::string(file->string_at(0));
}

// The read input element `number` of st's restored state names, checked to be the reader's.
const checkpoint::ReadInput& Engine::Impl::checked_read_input(const StageRuntime& st, int number) const {
  const checkpoint::StageState& state = *st.restore;
  const StageRuntime& reader = *stages[st.reads_from];
  const auto& ref = state.elements(number).ref();
  if (ref.input() >= static_cast<std::uint32_t>(state.read_inputs_size()))
    throw DataError(fmt::format("element {} names input {} of {}: the checkpoint is damaged", number, ref.input(), state.read_inputs_size()));
  const auto& input = state.read_inputs(static_cast<int>(ref.input()));
  if (input.stage() != reader.spec->id)
    throw DataError(fmt::format("element {} was read by stage '{}', which is not the one before it now ('{}')", number, input.stage(), reader.spec->id));
  return input;
}

// The held elements an interleave read: each input opened again and read to the record.
void Engine::Impl::read_from_inputs(StageRuntime& st, const std::vector<int>& refs, std::vector<Sample>& out, std::vector<std::string>& names) {
  const checkpoint::StageState& state = *st.restore;
  StageRuntime& reader = *stages[st.reads_from];
  StageDamage damage(*this, reader);
  std::unique_ptr<ExpandCursor> cursor;
  std::int64_t open_input = -1, next_record = -1;
  std::string input_name;
  for (int number : refs) {
    const auto& ref = state.elements(number).ref();
    const auto& input = checked_read_input(st, number);
    if (static_cast<std::int64_t>(ref.input()) != open_input) {
      Sample opened = decode_sample(input.input(), fmt::format("input {} of stage '{}'", ref.input(), reader.spec->id));
      input_name = opened.has_origin() ? opened.origin() : fmt::format("input {}", ref.input());
      cursor = reader.expand->open(std::move(opened), ElementContext{&reader.info, input.epoch(), input.index()}, damage);
      if (!cursor) throw DataError(fmt::format("{} opened to nothing", input_name));
      open_input = ref.input();
      next_record = 0;
    }
    Sample element;
    if (cursor->seek(ref.record(), ref.byte_offset())) {
      if (!cursor->next(element)) throw DataError(fmt::format("{} has no record {} at byte {} any more: it changed since the checkpoint", input_name, ref.record(), ref.byte_offset()));
      add(reader.reread, 1);
    } else {  // a cursor that cannot seek is read forward to the record
      if (next_record > ref.record()) {
        Sample again = decode_sample(input.input(), "input");
        cursor = reader.expand->open(std::move(again), ElementContext{&reader.info, input.epoch(), input.index()}, damage);
        next_record = 0;
      }
      do {
        if (!cursor->next(element)) throw DataError(fmt::format("{} ends before its record {}: it changed since the checkpoint", input_name, ref.record()));
        add(reader.reread, 1);
        next_record = element.shared_origin().record + 1;
      } while (element.shared_origin().record < ref.record());
    }
    if (element.shared_origin().record != ref.record())
      throw DataError(fmt::format("{} has record {} where record {} was (byte {}): it changed since the checkpoint", input_name,
                                  element.shared_origin().record, ref.record(), ref.byte_offset()));
    if (options.lineage) detail::stamp_read_epoch(element, input.epoch());  // (the epoch its input was read in)
    element.set_read_position(ref.epoch(), static_cast<std::int64_t>(ref.index()));
    out[static_cast<std::size_t>(number)] = std::move(element);
    names[static_cast<std::size_t>(number)] = input_name;
  }
}

// The elements read again, through the maps between, on as many threads as the widest of them
// runs (decoding a shuffle buffer of images again is most of a resume's time). They are
// stateless: any thread, any order, the same result.
void Engine::Impl::make_again(StageRuntime& st, const std::vector<int>& refs, std::vector<Sample>& out,
                                             const std::vector<std::string>& names) {
  const checkpoint::StageState& state = *st.restore;
  if (st.maps_since_read.empty()) return;
  std::vector<StageInfo> infos;
  int threads = 1;
  for (StageRuntime* map : st.maps_since_read) {
    infos.push_back(map->info);
    infos.back().placement = nullptr;  // what is made again goes back to the holder, not into a batch's rows
    threads = std::max(threads, map->workers);
  }
  const std::size_t first_made = st.maps_since_read.size() - st.maps_after_hand_on;
  std::atomic<std::size_t> next{0};
  std::mutex failure_mutex;
  std::string failure;
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < refs.size();) {
      const int number = refs[i];
      const auto& ref = state.elements(number).ref();
      Sample& element = out[static_cast<std::size_t>(number)];
      for (std::size_t m = 0; m < st.maps_since_read.size(); ++m) {
        StageRuntime* map = st.maps_since_read[m];
        const bool after_hand_on = m >= first_made;  // (read_referenced checked that such a reference has its place there)
        const ElementContext ctx{&infos[m], after_hand_on ? ref.made().epoch() : ref.epoch(), after_hand_on ? ref.made().index() : ref.index()};
        try {
          element = map->map->map(std::move(element), ctx);
        } catch (const std::exception& e) {
          std::lock_guard lock(failure_mutex);
          if (failure.empty())
            failure = fmt::format("stage '{}' failed on element {} of epoch {} read again from {} record {}: {}", map->spec->id, ref.index(),
                                  ref.epoch(), names[static_cast<std::size_t>(number)], ref.record(), e.what());
          next.store(refs.size());
          return;
        }
      }
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < std::min<int>(threads, static_cast<int>(refs.size())); ++t) helpers.emplace_back(work);
  work();
  for (auto& h : helpers) h.join();
  if (!failure.empty()) throw DataError(failure);
}

void Engine::Impl::restore_operator(StageRuntime& st) {
  if (st.ledger && st.restore && st.restore->has_ledger())
    *st.ledger = DeliveryLedger::load(st.restore->ledger(), fmt::format("the checkpoint of stage '{}'", st.spec->id));
  if (!st.restore || !st.spec->op->info.traits.saves_state || st.spec->per_input) return;
  if (st.restore->ended() && st.restore->operator_state().empty()) return;
  // A sink saves where its output stands; a checkpoint with nothing for it (taken before its
  // operator saved state) resumes with a fresh output, as runs did then.
  if (st.sink && st.restore->operator_state().empty()) return;
  auto referenced = std::make_shared<std::vector<Sample>>(read_referenced(st));
  CheckpointStateReader reader(*st.restore, st.restore->operator_state(), fmt::format("stage '{}' ({})", st.spec->id, st.spec->op->info.name),
                               [referenced](std::size_t number) { return (*referenced)[number]; });
  st.op->restore_state(reader);
  if (st.stacks) st.restored_rows = reader.origins_given();  // the rows of its next output
  if (!reader.at_end())
    throw Error(fmt::format("its saved state has bytes left over: the operator ({}) reads another state form than the one that saved it",
                            st.spec->op->library_path));
}

}  // namespace sluice
