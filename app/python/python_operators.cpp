// The host operators that call Python (python_map, python_filter, python_generator,
// python_tensor_slices) and the sink Python iterates (python_iterator): each operator's class and
// its description, registered as the host's own plugin "python".
#include "native.hpp"

namespace sluice::python {

// ---- the stages that call Python --------------------------------------------------------------


// A reference to a Python object held by a stage, dropped with the GIL from whichever thread
// destroys the stage (not at all once the interpreter is gone).
class PythonRef {
 public:
  PythonRef() = default;
  PythonRef(const PythonRef&) = delete;
  PythonRef& operator=(const PythonRef&) = delete;
  ~PythonRef() { reset(); }
  void reset(py::object object = py::object()) {
    if (!object_ && !object) return;
    if (!interpreter_alive()) {
      (void)object_.release();
      (void)object.release();
      return;
    }
    py::gil_scoped_acquire gil;
    object_ = std::move(object);
  }
  const py::object& get() const { return object_; }

 private:
  py::object object_;
};

std::mutex g_sites_mutex;
std::set<const PythonCallSite*>& python_call_sites() {
  static auto* sites = new std::set<const PythonCallSite*>();  // left at exit: a thread may still be inside
  return *sites;
}
std::string python_calls_now() {
  std::set<std::string> inside;
  {
    std::lock_guard lock(g_sites_mutex);
    for (const PythonCallSite* site : python_call_sites())
      if (site->inside.load() > 0) inside.insert(site->what);
  }
  std::string names;
  for (const auto& what : inside) names += (names.empty() ? "" : ", ") + what;
  return names;
}

// A thread the interpreter ends while it shuts down (one left behind by close(patience), which
// asked for the GIL after the interpreter began to finalize: Python 3.11 ends such a thread with
// pthread_exit) must not unwind through code that drops Python references without the GIL: that
// aborts the process. It waits here instead, and ends with the process a moment later.
[[noreturn]] void wait_for_the_process_to_end() {
  for (;;) ::pause();
}


// Calls `function` with one argument (none if null) through the C API: no C++ object holds a
// Python reference across the call, so a thread ended inside it drops none on its way out.
py::object call_python(const py::object& function, py::object argument) {
  PyObject* arg = argument.release().ptr();
  PyObject* result = arg ? PyObject_CallOneArg(function.ptr(), arg) : PyObject_CallNoArgs(function.ptr());
  Py_XDECREF(arg);
  if (!result) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}


// A stage calling the Python object its spec names; the object is looked up once, at start, not
// per element.
class PythonStage {
 protected:
  explicit PythonStage(const Params& p) : handle_(p.get_string("function")) {}
  ~PythonStage() {
    std::lock_guard lock(g_sites_mutex);
    python_call_sites().erase(&site_);
  }
  void resolve(const StageInfo& info, const char* role) {
    what_ = std::string("the ") + role + " of stage '" + info.id + "'";
    {
      std::lock_guard lock(g_sites_mutex);
      site_.what = what_;
      python_call_sites().insert(&site_);
    }
    py::gil_scoped_acquire gil;
    object_.reset(object_of(handle_));
  }
  std::string handle_, what_;
  PythonCallSite site_;
  PythonRef object_;
};

class PythonMap final : public Map, PythonStage {
 public:
  explicit PythonMap(const Params& p) : PythonStage(p) {}
  void start(const StageInfo& info) override { resolve(info, "function"); }
  Sample map(Sample in, const ElementContext&) override {
    return calling_python(site_, [&] {
      Sample out = sample_from_python(call_python(object_.get(), to_python(in)), what_);
      out.share_origin(in);
      return out;
    });
  }
};

class PythonFilter final : public Filter, PythonStage {
 public:
  explicit PythonFilter(const Params& p) : PythonStage(p) {}
  void start(const StageInfo& info) override { resolve(info, "predicate"); }
  bool keep(const Sample& in, const ElementContext&) override {
    return calling_python(site_, [&] { return bool(py::bool_(call_python(object_.get(), to_python(in)))); });
  }
};

// Each pass calls the function again for a fresh iterator (a generator function), or iterates
// the iterable again.
class PythonGenerator final : public Source, PythonStage {
 public:
  explicit PythonGenerator(const Params& p) : PythonStage(p) {}
  void start(const StageInfo& info) override { resolve(info, "generator"); }
  void begin_pass(std::uint64_t) override {
    calling_python(site_, [&] {
      const py::object& source = object_.get();
      iterator_.reset(py::iter(PyCallable_Check(source.ptr()) ? call_python(source) : source));
    });
  }
  bool next(Sample& out, const ElementContext& ctx) override {
    return calling_python(site_, [&] {
      py::handle item = PyIter_Next(iterator_.get().ptr());
      if (!item) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return false;
      }
      py::object owned = py::reinterpret_steal<py::object>(item);
      out = sample_from_python(owned, what_);
      out.set_origin("element " + std::to_string(ctx.index) + " of " + what_);
      return true;
    });
  }

 private:
  PythonRef iterator_;
};

// A list starting with bytes or str, or a NumPy array of text (objects, S or U).
bool is_text(const py::handle& value) {
  if (py::isinstance<py::list>(value))
    return py::len(value) > 0 && (py::isinstance<py::bytes>(value.cast<py::list>()[0]) || py::isinstance<py::str>(value.cast<py::list>()[0]));
  return is_text_array(value);
}

// from_tensor_slices: element i is row i of every array, over the arrays' own memory.
class PythonTensorSlices final : public Source {
 public:
  explicit PythonTensorSlices(const Params& p) {
    if (p.get_string("tensors").empty()) return;  // the registry's probe with defaults
    py::gil_scoped_acquire gil;
    py::dict arrays = object_of(p.get_string("tensors"));
    for (auto [key, value] : arrays) {
      const std::string name = py::str(key);
      Column column{name, {}};
      if (is_text(value)) {
        column.tensor = from_python(value, name);  // strings: copied once into one bytes tensor
        if (column.tensor.rank() == 0) throw ParamError("from_tensor_slices: field '" + name + "' is a scalar; it needs a first dimension to slice");
      } else {
        py::array array = py::array::ensure(value, py::array::c_style);
        if (!array) throw ParamError("from_tensor_slices: field '" + name + "' is not an array");
        const DType dtype = dtype_of_numpy(array.dtype(), name);
        if (array.ndim() == 0) throw ParamError("from_tensor_slices: field '" + name + "' is a scalar; it needs a first dimension to slice");
        // The array's memory, kept alive by a reference dropped (with the GIL) when the last
        // element or batch made from it is gone.
        auto* keep = new py::object(array);
        auto buffer = std::make_shared<Buffer>(static_cast<std::byte*>(array.mutable_data()), static_cast<std::size_t>(array.nbytes()),
                                               [keep](std::byte*, std::size_t) {
                                                 if (!interpreter_alive()) return;  // leaked at exit, on purpose
                                                 py::gil_scoped_acquire gil;
                                                 delete keep;
                                               });
        column.tensor = Tensor::view(dtype, Shape(array.shape(), array.shape() + array.ndim()), buffer);
      }
      if (!columns_.empty() && column.tensor.shape()[0] != columns_.front().tensor.shape()[0])
        throw ParamError("from_tensor_slices: field '" + name + "' has " + std::to_string(column.tensor.shape()[0]) + " rows, field '" +
                         columns_.front().name + "' has " + std::to_string(columns_.front().tensor.shape()[0]));
      columns_.push_back(std::move(column));
    }
    if (columns_.empty()) throw ParamError("from_tensor_slices: no fields");
  }
  void begin_pass(std::uint64_t) override { next_ = 0; }
  void save_state(StateWriter& w) const override { w.put(next_); }
  void restore_state(StateReader& r) override { next_ = r.get<decltype(next_)>(); }
  bool next(Sample& out, const ElementContext&) override {
    if (columns_.empty() || next_ >= columns_.front().tensor.shape()[0]) return false;
    out.reserve(columns_.size());
    for (const auto& column : columns_) out.set(column.name, column.tensor.row(next_));
    ++next_;
    return true;
  }
  std::int64_t expected_elements() const override { return columns_.empty() ? 0 : columns_.front().tensor.shape()[0]; }

 private:
  struct Column {
    std::string name;
    Tensor tensor;
  };
  std::vector<Column> columns_;
  std::int64_t next_ = 0;
};


// One host operator of plugin "python": its only parameter names a Python object (or queue) by
// handle; empty by default, so that the registry can build it with defaults.
template <class Op>
void add_python_operator(Registry& r, std::string name, OperatorKind kind, std::string summary, std::string param,
                         std::string param_doc, bool stateless, OperatorRole role = OperatorRole::CallsPython) {
  OperatorInfo info;
  info.name = std::move(name);
  info.kind = kind;
  info.summary = std::move(summary);
  ParamSpec handle;
  handle.name = std::move(param);
  handle.type = ParamType::String;
  handle.doc = std::move(param_doc);
  handle.default_value = "";
  info.params = {handle};
  info.traits.stateless = stateless;
  info.traits.role = role;
  info.traits.saves_state = std::is_same_v<Op, PythonTensorSlices>;  // a generator's place cannot be saved
  info.create = [](const Params& p) { return std::make_unique<Op>(p); };
  r.add_host_operator(std::move(info), "python");
}

void add_host_operators(Registry& r) {
  add_python_operator<PythonMap>(r, "python_map", OperatorKind::Map,
                                 "Calls a Python function on each element (a dict of NumPy arrays); it returns the new element. "
                                 "Holds the GIL while it runs.",
                                 "function", "the function, as registered by sluice.data", true);
  add_python_operator<PythonFilter>(r, "python_filter", OperatorKind::Filter,
                                    "Keeps the elements for which a Python predicate is true. Holds the GIL while it runs.",
                                    "function", "the predicate, as registered by sluice.data", true);
  add_python_operator<PythonGenerator>(r, "python_generator", OperatorKind::Source,
                                       "Elements from a Python generator function (called again for each pass) or iterable. "
                                       "Holds the GIL while it runs.",
                                       "function", "the generator function or iterable, as registered by sluice.data", false);
  add_python_operator<PythonTensorSlices>(r, "python_tensor_slices", OperatorKind::Source,
                                          "Element i is row i of every array of a dict (tf.data's from_tensor_slices), over the "
                                          "arrays' own memory.",
                                          "tensors", "the dict of arrays, as registered by sluice.data", false);
  add_python_operator<PythonIterator>(r, "python_iterator", OperatorKind::Sink,
                                      "Hands each element to Python's iterator (added by sluice.Pipeline).", "queue",
                                      "the iterator's queue", false, OperatorRole::FeedsPython);
  service::add_service_operators(r);  // service_source, in place of the stages a `distribute` sends away
}

}  // namespace sluice::python
