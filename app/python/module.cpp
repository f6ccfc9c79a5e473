// sluice._sluice: the Python face's native part. It runs pipelines on the same engine as the CLI
// and hands their output to Python without copying: a batch's fields become NumPy arrays (or
// DLPack tensors) over the batch's own memory, which goes back to its pool when Python drops
// them. Python functions run as stages on the engine's workers (python_map, python_filter,
// python_generator, python_tensor_slices), taking the GIL for each call.
//
// The GIL is released whenever this code waits for the engine (next element, stop, join), so
// engine threads running Python functions can always finish the call they are in.
#include "native.hpp"

namespace sluice::python {
namespace {

// NumPy's C API (pybind11 initialises it in a function-local static) and traceback are loaded
// here, on the importing thread: loaded first by two engine workers at once, the static's guard
// and the import lock wait on each other.
void load_what_engine_threads_need() {
  py::module_::import("numpy");
  (void)py::array(py::dtype::of<std::uint8_t>(), std::vector<py::ssize_t>{0});
  py::module_::import("traceback");
}

// sluice.SpecError and sluice.PipelineError, and SpecError raised from C++ as the former.
void bind_errors(py::module_& m) {
  g_spec_error = py::reinterpret_borrow<py::object>(PyErr_NewExceptionWithDoc(
      "sluice.SpecError", "A pipeline that cannot run: .problems lists each (file, line, stage, parameter, message).", PyExc_ValueError, nullptr));
  g_pipeline_error = py::reinterpret_borrow<py::object>(PyErr_NewExceptionWithDoc(
      "sluice.PipelineError", "A run that failed: the message names the stage, the element and where it came from; .stage is the stage's id.",
      PyExc_RuntimeError, nullptr));
  m.attr("SpecError") = g_spec_error;
  m.attr("PipelineError") = g_pipeline_error;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const SpecError& e) {
      PyErr_SetString(g_spec_error.ptr(), e.what());
    }
  });
}

// The loaded operators' schemas, and one builder call's parameters checked.
void bind_operators(py::module_& m) {
  m.def("operators", [](const std::vector<std::string>& plugin_dirs) {
    py::list out;
    for (const auto& op : loaded_registry(plugin_dirs).operators()) {
      py::dict d;
      d["name"] = op->info.name;
      d["kind"] = operator_kind_name(op->info.kind);
      d["summary"] = op->info.summary;
      d["plugin"] = op->plugin_name;
      d["stateless"] = op->info.traits.stateless;
      py::list params;
      for (const auto& p : op->info.params) {
        py::dict pd;
        pd["name"] = p.name;
        pd["type"] = param_type_name(p.type);
        pd["doc"] = p.doc;
        pd["default"] = p.default_value ? py::cast(*p.default_value) : py::none();
        pd["choices"] = p.choices;
        params.append(pd);
      }
      d["params"] = params;
      out.append(d);
    }
    return out;
  }, py::arg("plugin_dirs") = std::vector<std::string>{});

  m.def("closest", [](const std::string& name) { return loaded_registry({}).closest(name); });

  // Whether a stage of `op` with these parameters takes workers (the core's answer, as validation
  // and the engine give it): what num_parallel_calls= may set.
  m.def("takes_workers", [](const std::string& op, const std::map<std::string, std::string>& given) {
    const auto registered = loaded_registry({}).find(op);
    // Parameters that do not build yet: the builder reports them; the count stays on offer.
    return !registered || takes_workers(*registered, {given.begin(), given.end()}).value_or(true);
  }, py::arg("op"), py::arg("params"));

  // One builder call's parameters, checked as validation checks a stage's: each value against its
  // schema, then the operator built from them (parameters refused together). Problems as
  // (parameter, message), the parameter empty when the message concerns several; unknown
  // operators and parameters are the builder's to name.
  m.def("check_parameters", [](const std::string& op, const std::map<std::string, std::string>& given) {
    std::vector<std::pair<std::string, std::string>> problems;
    const auto registered = loaded_registry({}).find(op);
    if (!registered) return problems;
    std::vector<std::pair<std::string, std::string>> known;
    for (const auto& [name, text] : given) {
      const auto& schema = registered->info.params;
      const auto spec = std::find_if(schema.begin(), schema.end(), [&](const ParamSpec& p) { return p.name == name; });
      if (spec == schema.end()) continue;
      try {
        parse_param(*spec, text);
        known.emplace_back(name, text);
      } catch (const std::exception& e) {
        problems.emplace_back(name, e.what());
      }
    }
    if (!problems.empty()) return problems;
    try {
      registered->info.create(parse_params(registered->info.params, known));
    } catch (const std::exception& e) {
      problems.emplace_back("", e.what());
    }
    return problems;
  }, py::arg("op"), py::arg("params"));
}

// Pipeline files validated, specs from JSON, this process's place among the job's workers.
void bind_pipeline_files(py::module_& m) {
  m.def("validate", [](const std::string& text, const std::string& file, const std::map<std::string, std::string>& sets,
                       std::optional<std::uint64_t> seed, const std::vector<std::string>& plugin_dirs, bool iterate,
                       const std::string& output) {
    Registry& r = loaded_registry(plugin_dirs);
    PipelineDocument doc = document_of(text, file, sets, seed);
    const spec::PipelineSpec as_written = doc.spec;
    std::string feed_stage;
    if (iterate) attach_iterator(doc, r, feed_stage, output);
    auto problems = validate_pipeline(doc, r);
    if (!problems.empty()) raise_spec_error(SpecError(problems));
    return pipeline_to_text(as_written);
  }, py::arg("text"), py::arg("file"), py::arg("sets") = std::map<std::string, std::string>{}, py::arg("seed") = std::nullopt,
     py::arg("plugin_dirs") = std::vector<std::string>{}, py::arg("iterate") = true, py::arg("output") = "");

  // Pipeline(skip_records=): the pipeline's text with the named records dropped before its
  // first batch (skip_named_records), so that states, replays and the service see one pipeline.
  m.def("skip_named_records", [](const std::string& text, const std::string& file, const std::string& records,
                                 const std::vector<std::string>& plugin_dirs) {
    Registry& r = loaded_registry(plugin_dirs);
    PipelineDocument doc;
    try {
      doc = parse_pipeline(text, file);
    } catch (const SpecError& e) {
      raise_spec_error(e);
    }
    try {
      skip_named_records(doc, r, records);
    } catch (const Error& e) {
      throw py::value_error(std::string("skip_records: ") + e.what());
    }
    return pipeline_to_text(doc.spec);
  });

  m.def("worker_identity", [](std::optional<int> index, std::optional<int> count) {
    const WorkerIdentity id = worker_of(index, count);
    return py::make_tuple(id.index, id.count, id.origin());
  }, py::arg("worker_index") = std::nullopt, py::arg("num_workers") = std::nullopt,
     "(index, count, source) of this process among the job's workers, from the arguments or the launcher's variables.");

  m.def("ledger_of_states", [](const std::vector<std::string>& states, const std::vector<std::string>& ledgers) {
    DeliveryLedger merged;
    bool ended = true;
    const std::size_t count = states.size() + ledgers.size();
    for (std::size_t k = 0; k < count; ++k) {
      const std::string what = fmt::format("state {} of {}", k, count);
      checkpoint::Ledger message;
      try {
        if (k < states.size()) {
          const checkpoint::Checkpoint state = parse_state(states[k], what);
          if (!state.has_ledger()) throw Error(what + " has no ledger: it was taken by a Pipeline made without lineage=True");
          message = state.ledger();
        } else if (!message.ParseFromString(ledgers[k - states.size()])) {
          throw Error(what + "'s ledger is damaged: it does not decode");
        }
        DeliveryLedger one = DeliveryLedger::load(message, what);
        ended = ended && one.run_ended();
        merged.merge(one);
      } catch (const Error& e) {
        throw py::value_error(e.what());
      }
    }
    merged.set_run_ended(ended && count > 0);
    const auto verdicts = merged.verdicts();
    py::dict out;
    out["epochs"] = verdicts_to_python(verdicts);
    out["text"] = format_verdicts(verdicts, merged.run_ended());
    out["clean"] = verdicts_clean(verdicts);
    return out;
  }, py::arg("states"), py::arg("ledgers"), "The delivery ledgers of several states merged (a job's workers): each epoch's verdict.");

  m.def("merged_ledgers", [](const std::vector<std::string>& ledgers) {
    DeliveryLedger merged;
    for (const auto& bytes : ledgers) merged.merge(ledger_from_bytes(bytes, "a ledger given"));
    checkpoint::Ledger out;
    merged.save(out);
    return py::bytes(out.SerializeAsString());
  }, py::arg("ledgers"), "Several ledgers' bytes as one.");

  m.def("spec_from_json", [](const std::string& json) {
    try {
      return pipeline_to_text(parse_pipeline(json, "built in Python").spec);
    } catch (const SpecError& e) {
      raise_spec_error(e);
    }
  });
}

// Remote objects read and listed (tfds metadata in object storage).
void bind_remote(py::module_& m) {
  m.def("read_remote_text", [](const std::string& uri) { return read_remote_text(uri); }, py::call_guard<py::gil_scoped_release>(),
        "A whole remote object (s3://, gs://, http(s)://) as text, read with the environment's settings (metadata files).");
  m.def("list_remote", [](const std::string& prefix) { return list_remote(prefix); }, py::call_guard<py::gil_scoped_release>(),
        "The URIs of the objects under an s3:// or gs:// prefix, sorted.");
}

// Python objects kept under handles a spec names.
void bind_objects(py::module_& m) {
  m.def("hold", [](py::object object, const std::string& name) { return hold_object(std::move(object), name); }, py::arg("object"),
        py::arg("name") = "",
        "Keeps a Python object (a stage's function, a dict of arrays) under a handle a spec can name.");
  m.def("forget", [](const std::string& handle) { forget_object(handle); });
}

}  // namespace
}  // namespace sluice::python

PYBIND11_MODULE(_sluice, m) {
  using namespace sluice::python;
  m.doc() = "The native part of the sluice package: runs pipelines on Sluice's engine.";
  load_what_engine_threads_need();
  bind_errors(m);
  bind_operators(m);
  bind_pipeline_files(m);
  bind_remote(m);
  bind_objects(m);
  bind_tensor(m);
  bind_runner(m);
  bind_positioned(m);
}
