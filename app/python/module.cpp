// sluice._sluice: the Python face's native part. It runs pipelines on the same engine as the CLI
// and hands their output to Python without copying: a batch's fields become NumPy arrays (or
// DLPack tensors) over the batch's own memory, which goes back to its pool when Python drops
// them. Python functions run as stages on the engine's workers (python_map, python_filter,
// python_generator, python_tensor_slices), taking the GIL for each call.
//
// The GIL is released whenever this code waits for the engine (next element, stop, join), so
// engine threads running Python functions can always finish the call they are in.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlpack/dlpack.h>
#include <fmt/format.h>

#include <boost/dll/runtime_symbol_info.hpp>

#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include <future>

#include "sluice/core/checkpoint.hpp"
#include "sluice/core/element_queue.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/metrics_log.hpp"
#include "sluice/core/metrics_server.hpp"
#include "sluice/core/output_rows.hpp"
#include "sluice/core/param_parse.hpp"
#include "sluice/core/remote_files.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/report.hpp"
#include "sluice/core/spec.hpp"
#include "sluice/core/text.hpp"
#include "sluice/service/service.hpp"
#include "sluice/operator.hpp"

#include "cuda_driver.hpp"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace sluice::python {
namespace {

// ---- Python objects the stages call, by handle ------------------------------------------------

// The spec names a Python object by a handle ("python:N"), so that a pipeline stays a plain
// PipelineSpec; the object is held here until the Python side forgets it.
std::mutex g_objects_mutex;
std::map<std::string, py::object>& objects() {
  static auto* table = new std::map<std::string, py::object>;  // never destroyed: outlives the interpreter's teardown
  return *table;
}
std::atomic<std::uint64_t> g_next_handle{1};

// Held under "python:NAME" (NAME from the Python side: the function's name and a digest of its
// code, the same in every run of a script whatever it built first, so that its states load), or
// "python:NAME#k" for the k-th object of that name held at once; without a name, by count.
std::string hold_object(py::object object, const std::string& name) {
  std::lock_guard lock(g_objects_mutex);
  std::string handle = name.empty() ? "python:" + std::to_string(g_next_handle++) : "python:" + name;
  for (int k = 2; objects().count(handle); ++k) handle = "python:" + name + "#" + std::to_string(k);
  objects()[handle] = std::move(object);
  return handle;
}
void forget_object(const std::string& handle) {
  py::object dropped;  // decref'd after the lock, with the GIL held by the caller
  std::lock_guard lock(g_objects_mutex);
  auto it = objects().find(handle);
  if (it == objects().end()) return;
  dropped = std::move(it->second);
  objects().erase(it);
}
py::object object_of(const std::string& handle) {
  std::lock_guard lock(g_objects_mutex);
  auto it = objects().find(handle);
  if (it == objects().end())
    throw Error("'" + handle + "' names no Python object of this process (a pipeline with Python functions runs only from the Python that built it)");
  return it->second;
}

bool interpreter_alive() { return Py_IsInitialized() && !_Py_IsFinalizing(); }

// ---- tensors between C++ and Python -----------------------------------------------------------

py::dtype numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::U8: return py::dtype::of<std::uint8_t>();
    case DType::I16: return py::dtype::of<std::int16_t>();
    case DType::I32: return py::dtype::of<std::int32_t>();
    case DType::I64: return py::dtype::of<std::int64_t>();
    case DType::F16: return py::dtype("float16");
    case DType::BF16: return py::dtype::of<std::uint16_t>();  // NumPy has no bfloat16: the bits, as uint16
    case DType::F32: return py::dtype::of<float>();
    case DType::F64: return py::dtype::of<double>();
    case DType::Bytes: break;
  }
  throw Error("a bytes tensor has no NumPy dtype");
}

std::vector<py::ssize_t> strides_of(const Shape& shape, std::size_t item) {
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t step = static_cast<py::ssize_t>(item);
  for (std::size_t d = shape.size(); d-- > 0;) {
    strides[d] = step;
    step *= static_cast<py::ssize_t>(shape[d]);
  }
  return strides;
}

// A NumPy array over `data`; `owner` (freed with the array) keeps the memory alive.
template <class Owner>
py::array numpy_view(void* data, DType dtype, const Shape& shape, Owner owner) {
  auto* held = new Owner(std::move(owner));
  py::capsule base(held, [](void* p) { delete static_cast<Owner*>(p); });
  return py::array(numpy_dtype(dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()), strides_of(shape, dtype_size(dtype)),
                   data, base);
}

// A NumPy array over the tensor's memory; the array keeps the buffer alive.
py::object to_python(const Tensor& tensor) {
  if (tensor.dtype() == DType::Bytes) {
    auto as_bytes = [&](std::int64_t i) {
      auto s = tensor.string_at(i);
      return py::bytes(s.data(), s.size());
    };
    if (tensor.rank() == 0) return as_bytes(0);
    // A NumPy array of bytes objects in the tensor's shape, as tf.data's as_numpy_iterator gives.
    py::array out(py::dtype("O"), std::vector<py::ssize_t>(tensor.shape().begin(), tensor.shape().end()));
    auto** slots = static_cast<PyObject**>(out.mutable_data());
    for (std::int64_t i = 0; i < tensor.num_elements(); ++i) {
      Py_XDECREF(slots[i]);  // NumPy filled the new array with None
      slots[i] = as_bytes(i).release().ptr();
    }
    return out;
  }
  return numpy_view(const_cast<std::byte*>(tensor.raw_data()), tensor.dtype(), tensor.shape(), tensor.buffer());
}

py::dict to_python(const Sample& sample) {
  py::dict out;
  for (const auto& field : sample.fields()) out[py::str(field.name)] = to_python(field.tensor);
  return out;
}

DType dtype_of_numpy(const py::dtype& dtype, const std::string& field) {
  const char kind = dtype.kind();
  const auto size = dtype.itemsize();
  if (kind == 'b' || (kind == 'u' && size == 1)) return DType::U8;
  if (kind == 'i' && size == 2) return DType::I16;
  if (kind == 'i' && size == 4) return DType::I32;
  if (kind == 'i' && size == 8) return DType::I64;
  if (kind == 'f' && size == 2) return DType::F16;
  if (kind == 'f' && size == 4) return DType::F32;
  if (kind == 'f' && size == 8) return DType::F64;
  throw DataError("field '" + field + "': NumPy dtype " + py::str(static_cast<const py::handle&>(dtype)).cast<std::string>() +
                  " has no Sluice type (use uint8, bool, int16/32/64, float16/32/64, bytes or str)");
}

// Whether `value` is a NumPy array of text: of objects (bytes or str), or NumPy's fixed-width S and U.
bool is_text_array(const py::handle& value) {
  if (!py::isinstance<py::array>(value)) return false;
  const char kind = py::reinterpret_borrow<py::array>(value).dtype().kind();
  return kind == 'O' || kind == 'S' || kind == 'U';
}

// A NumPy array of text (bytes or str objects, or NumPy's fixed-width S and U) as a bytes tensor
// of its shape: what iterating gives for text comes back unchanged.
Tensor text_from_numpy(const py::array& array, const std::string& field) {
  std::vector<std::string> held;
  held.reserve(static_cast<std::size_t>(array.size()));
  for (auto item : array.attr("reshape")(-1).attr("tolist")().cast<py::list>()) {
    if (py::isinstance<py::bytes>(item)) held.emplace_back(item.cast<py::bytes>());
    else if (py::isinstance<py::str>(item)) held.push_back(item.cast<std::string>());
    else
      throw DataError("field '" + field + "': a NumPy array of objects holds " + std::string(py::str(py::type::of(item))) +
                      "; only arrays of bytes or str are text (convert numbers with numpy.asarray(..., dtype=...))");
  }
  std::vector<std::string_view> views(held.begin(), held.end());
  return Tensor::from_strings(views, Shape(array.shape(), array.shape() + array.ndim()));
}

// A Python value as a tensor (copied: the stage's output must not depend on Python objects).
Tensor from_python(const py::handle& value, const std::string& field) {
  if (py::isinstance<py::bytes>(value) || py::isinstance<py::str>(value)) {
    std::string s = py::isinstance<py::str>(value) ? value.cast<std::string>() : std::string(value.cast<py::bytes>());
    return Tensor::from_string(s);
  }
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    auto seq = py::reinterpret_borrow<py::sequence>(value);
    bool all_text = seq.size() > 0;
    for (auto item : seq) all_text = all_text && (py::isinstance<py::bytes>(item) || py::isinstance<py::str>(item));
    if (all_text) {
      std::vector<std::string> held;
      for (auto item : seq) held.push_back(py::isinstance<py::str>(item) ? item.cast<std::string>() : std::string(item.cast<py::bytes>()));
      std::vector<std::string_view> views(held.begin(), held.end());
      return Tensor::from_strings(views, {static_cast<std::int64_t>(views.size())});
    }
  }
  if (is_text_array(value)) return text_from_numpy(py::reinterpret_borrow<py::array>(value), field);
  py::array array = py::array::ensure(value, py::array::c_style | py::array::forcecast);
  if (!array) throw DataError("field '" + field + "': " + std::string(py::str(py::type::of(value))) + " is not an array, a number, bytes or str");
  const DType dtype = dtype_of_numpy(array.dtype(), field);
  Shape shape(array.shape(), array.shape() + array.ndim());
  Tensor tensor = Tensor::empty(dtype, shape);
  if (tensor.nbytes()) std::memcpy(tensor.raw_data(), array.data(), tensor.nbytes());
  return tensor;
}

// A function's result as an element: a dict of fields, or one value (field "value").
Sample sample_from_python(const py::handle& result, const std::string& what) {
  Sample out;
  if (py::isinstance<py::dict>(result)) {
    for (auto [key, value] : py::reinterpret_borrow<py::dict>(result)) {
      const std::string name = py::str(key);
      out.set(name, from_python(value, name));
    }
    if (out.empty()) throw DataError(what + " returned an empty dict");
    return out;
  }
  if (result.is_none()) throw DataError(what + " returned None (return a dict of fields, or a value)");
  out.set("value", from_python(result, "value"));
  return out;
}

// The Python exception being handled, with its traceback, as the element's error.
[[noreturn]] void rethrow_python_error(py::error_already_set& e, const std::string& what) {
  std::string text;
  try {
    py::object format = py::module_::import("traceback").attr("format_exception");
    for (auto line : format(e.type(), e.value(), e.trace())) text += py::str(line).cast<std::string>();
  } catch (...) {
    text = e.what();
  }
  while (!text.empty() && text.back() == '\n') text.pop_back();
  throw DataError(what + " raised:\n" + text);
}

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

// A stage's Python object as messages name it ("the function of stage 'm'"), and how many engine
// threads are inside a call of it now, so that a run that cannot stop says which function holds
// it. A site is registered once, when its stage starts; a call only counts up and down.
struct PythonCallSite {
  std::string what;
  std::atomic<int> inside{0};
};
std::mutex g_sites_mutex;
std::set<const PythonCallSite*>& python_call_sites() {
  static auto* sites = new std::set<const PythonCallSite*>();  // left at exit: a thread may still be inside
  return *sites;
}
struct InPythonCall {
  explicit InPythonCall(PythonCallSite& site) : site(site) { ++site.inside; }
  ~InPythonCall() { --site.inside; }
  PythonCallSite& site;
};
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

// Runs `wait` without the GIL, as gil_scoped_release does, for the waits of the training loop's
// thread. That thread may be a daemon thread the interpreter does not wait for at exit: taking
// the GIL back after the interpreter began to finalize would end it from inside a destructor
// (gil_scoped_release's, which may not throw: std::terminate), so it waits for the end instead.
template <class Wait>
auto without_gil(Wait&& wait) {
  PyThreadState* saved = PyEval_SaveThread();
  auto take_back = [saved] {
    if (_Py_IsFinalizing()) wait_for_the_process_to_end();
    PyEval_RestoreThread(saved);
  };
  try {
    auto result = wait();
    take_back();
    return result;
  } catch (...) {
    take_back();
    throw;
  }
}

// Calls `function` with one argument (none if null) through the C API: no C++ object holds a
// Python reference across the call, so a thread ended inside it drops none on its way out.
py::object call_python(const py::object& function, py::object argument = py::object()) {
  PyObject* arg = argument.release().ptr();
  PyObject* result = arg ? PyObject_CallOneArg(function.ptr(), arg) : PyObject_CallNoArgs(function.ptr());
  Py_XDECREF(arg);
  if (!result) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}

// Runs `use` with the GIL held; a Python exception becomes the element's DataError, with its
// traceback, labelled with the site's name.
template <class Use>
auto calling_python(PythonCallSite& site, Use&& use) {
  InPythonCall inside(site);
  try {
    py::gil_scoped_acquire gil;
    try {
      return use();
    } catch (py::error_already_set& e) {
      rethrow_python_error(e, site.what);
    } catch (abi::__forced_unwind&) {
      wait_for_the_process_to_end();  // ended inside the call
    }
  } catch (abi::__forced_unwind&) {
    wait_for_the_process_to_end();  // ended while asking for the GIL
  }
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

// ---- the sink that hands elements to the iterator --------------------------------------------

// Between the engine's sink thread and Python's next(): a QueueSink over a short ElementQueue
// (sluice/core/element_queue.hpp), so that the pipeline runs ahead of the training step by its
// own buffers, not by an unbounded list here.
using PythonIterator = QueueSink;

// ---- plugins -----------------------------------------------------------------------------------

std::mutex g_registry_mutex;
Registry& registry() {
  static auto* r = new Registry;  // operators' code lives in the plugin libraries: never unloaded
  return *r;
}
std::set<std::string>& loaded_dirs() {
  static auto* dirs = new std::set<std::string>;
  return *dirs;
}

// The plugins built or installed with this module: ../../lib/sluice/plugins from the build tree's
// python/sluice/, ../../../sluice/plugins from an installed lib/python3/dist-packages/sluice/.
std::vector<fs::path> bundled_plugin_dirs() {
  std::error_code ec;
  fs::path self = boost::dll::this_line_location(ec);
  if (ec) return {};
  const fs::path folder = self.parent_path();
  return {(folder / ".." / ".." / "lib" / "sluice" / "plugins").lexically_normal(),
          (folder / ".." / ".." / ".." / "sluice" / "plugins").lexically_normal()};
}

// One host operator of plugin "python": its only parameter names a Python object (or queue) by
// handle; empty by default, so that the registry can build it with defaults.
template <class Op>
void add_python_operator(Registry& r, std::string name, OperatorKind kind, std::string summary, std::string param,
                         std::string param_doc, bool stateless) {
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
                                      "the iterator's queue", false);
  service::add_service_operators(r);  // service_source, in place of the stages a `distribute` sends away
}

// Describes the bundled plugins, SLUICE_PLUGIN_PATH and `extra` (once each) through the registry
// cache, and adds the host operators; a plugin library's code is loaded when a pipeline uses it.
Registry& loaded_registry(const std::vector<std::string>& extra) {
  std::lock_guard lock(g_registry_mutex);
  Registry& r = registry();
  static bool first = true;
  std::vector<fs::path> dirs;
  if (first) {
    first = false;
    add_host_operators(r);
    for (const auto& d : bundled_plugin_dirs())
      if (fs::is_directory(d)) {
        dirs.push_back(d);
        break;
      }
    for (const auto& d : Registry::search_path({}))
      if (d != Registry::bundled_plugin_dir()) dirs.push_back(d);  // python's own folder has no plugins
  }
  for (const auto& d : extra) {
    if (!fs::is_directory(d)) throw Error("plugin folder '" + d + "' does not exist");
    dirs.emplace_back(d);
  }
  for (const auto& d : dirs) {
    std::error_code ec;
    const std::string key = fs::weakly_canonical(d, ec).string();
    if (!loaded_dirs().insert(key).second) continue;
    r.load_directory(d);
  }
  // A damaged registry cache (rebuilt) is worth a warning, once per process.
  static std::size_t warned = 0;
  for (; warned < r.warnings().size(); ++warned)
    if (PyErr_WarnEx(PyExc_RuntimeWarning, r.warnings()[warned].c_str(), 1) != 0) throw py::error_already_set();
  return r;
}

// ---- errors ------------------------------------------------------------------------------------

py::object g_spec_error, g_pipeline_error;

[[noreturn]] void raise_spec_error(const SpecError& e) {
  py::list problems;
  for (const auto& p : e.problems()) {
    py::dict d;
    d["file"] = p.file;
    d["line"] = p.line;
    d["column"] = p.column;
    d["stage"] = p.stage;
    d["param"] = p.param;
    d["message"] = p.message;
    d["text"] = p.to_string();
    problems.append(d);
  }
  py::object error = g_spec_error(py::str(e.what()));
  error.attr("problems") = problems;
  PyErr_SetObject(g_spec_error.ptr(), error.ptr());
  throw py::error_already_set();
}

[[noreturn]] void raise_pipeline_error(const std::string& message, const std::string& stage) {
  py::gil_scoped_acquire hold;
  py::object error = g_pipeline_error(py::str(message));
  error.attr("stage") = stage;
  PyErr_SetObject(g_pipeline_error.ptr(), error.ptr());
  throw py::error_already_set();
}

// This process's place among the job's workers (torchrun's RANK and WORLD_SIZE, Slurm, MPI, ...),
// or the one asked for; the same rules as the CLI's --worker-index/--num-workers.
WorkerIdentity worker_of(std::optional<int> index, std::optional<int> count) {
  try {
    return detect_worker_identity(process_environment(), {index, count, "worker_index/num_workers"});
  } catch (const WorkerIdentityError& e) {
    throw py::value_error(e.what());
  }
}

PipelineDocument document_of(const std::string& text, const std::string& file, const std::map<std::string, std::string>& sets,
                             std::optional<std::uint64_t> seed) {
  try {
    PipelineDocument doc = parse_pipeline(text, file);
    std::vector<std::string> overrides;
    for (const auto& [key, value] : sets) overrides.push_back(key + "=" + value);
    apply_overrides(doc, overrides);
    if (seed) doc.spec.mutable_options()->set_seed(*seed);
    service::split_at_service(doc);  // a `distribute` stage and those before it run on the Sluice service
    return doc;
  } catch (const SpecError& e) {
    raise_spec_error(e);
  }
}

// ---- DLPack ------------------------------------------------------------------------------------

// Said once per process: the run goes on correctly, only with the host waiting for each copy.
void warn_once_about_host_waits(const std::string& why) {
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "sluice: feed slices are waited for on the host, not on the consumer's CUDA stream: %s\n", why.c_str());
  });
}

// A feed slice's slot, given back when the last tensor made from it is dropped (by whoever drops
// it: torch may, without the GIL). It keeps the engine whose memory the slice is in, stopped and
// joined by close() before the Runner lets go of it.
struct FeedSlot {
  Feed* feed = nullptr;
  FeedSlice slice;
  std::shared_ptr<Engine> owner;
  // The stream a DLPack consumer said it reads on (__dlpack__(stream=...)): the feed overwrites
  // the slot only after the work queued there when the slot was given back.
  std::atomic<void*> consumer_stream{nullptr};
  std::atomic<bool> copied_on_host{false};  // wait_ready() returned: safe to read from anywhere

  // Makes the slice safe to read for a consumer on DLPack stream `stream` (nullopt: on the host,
  // as data_ptr readers do). A CUDA slice's copy event is waited on the consumer's stream, so
  // the host goes on at once; where that cannot be done (no stream, -1 "do not synchronise",
  // the driver refused) the host waits for the copies instead, which is always correct.
  void make_ready(std::optional<std::intptr_t> stream) {
    if (copied_on_host.load()) return;
    if (slice.ready_event && stream && *stream != -1) {
      std::string why;
      if (cuda_stream_wait_event(*stream, slice.ready_event, slice.ordinal, why)) return;
      warn_once_about_host_waits(why);
    }
    py::gil_scoped_release release;
    feed->wait_ready(slice);
    copied_on_host.store(true);
  }
  ~FeedSlot() {
    try {
      feed->release(slice, consumer_stream.load());
    } catch (const std::exception& e) {
      // Released twice is a bug of this module; a destructor must not throw it.
      std::fprintf(stderr, "sluice: giving a feed slice back failed: %s\n", e.what());
    }
  }
};

// A tensor Python code can hand to any DLPack consumer (torch.from_dlpack, numpy.from_dlpack,
// JAX, CuPy) without a copy.
struct DlTensor {
  std::shared_ptr<Buffer> buffer;  // null for a feed slice, whose memory is the feed's
  std::shared_ptr<FeedSlot> slot;  // set for a feed slice
  void* data = nullptr;
  DType dtype = DType::U8;
  Shape shape;
  int device_type = kDLCPU;
  int device_id = 0;
};

struct DlContext {
  DLManagedTensor managed{};
  DlTensor tensor;
  std::vector<std::int64_t> shape;
};

DLDataType dl_dtype(DType dtype) {
  switch (dtype) {
    case DType::U8: return {kDLUInt, 8, 1};
    case DType::I16: return {kDLInt, 16, 1};
    case DType::I32: return {kDLInt, 32, 1};
    case DType::I64: return {kDLInt, 64, 1};
    case DType::F16: return {kDLFloat, 16, 1};
    case DType::BF16: return {kDLBfloat, 16, 1};
    case DType::F32: return {kDLFloat, 32, 1};
    case DType::F64: return {kDLFloat, 64, 1};
    case DType::Bytes: break;
  }
  throw Error("a bytes tensor cannot be exported through DLPack");
}

py::capsule to_dlpack(const DlTensor& t) {
  auto* ctx = new DlContext;
  ctx->tensor = t;
  ctx->shape.assign(t.shape.begin(), t.shape.end());
  DLTensor& dl = ctx->managed.dl_tensor;
  dl.data = t.data;
  dl.device = {static_cast<DLDeviceType>(t.device_type), t.device_id};
  dl.ndim = static_cast<int>(ctx->shape.size());
  dl.dtype = dl_dtype(t.dtype);
  dl.shape = ctx->shape.data();
  dl.strides = nullptr;  // compact, row-major
  dl.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensor* self) { delete static_cast<DlContext*>(self->manager_ctx); };
  // A capsule no consumer took still owns the tensor; one taken is renamed "used_dltensor".
  return py::capsule(&ctx->managed, "dltensor", [](PyObject* capsule) {
    if (!PyCapsule_IsValid(capsule, "dltensor")) return;
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed && managed->deleter) managed->deleter(managed);
  });
}

DlTensor dl_tensor_of(const Tensor& tensor) {
  if (tensor.dtype() == DType::Bytes) throw Error("bytes fields have no DLPack form");
  return DlTensor{tensor.buffer(), {}, const_cast<std::byte*>(tensor.raw_data()), tensor.dtype(), tensor.shape(), kDLCPU, 0};
}

// ---- a run ------------------------------------------------------------------------------------

// The pipeline's output goes to Python: to a python_iterator stage taking the place of its sink
// (or after its last stage when it has none), which is returned. A gpu_feed sink stays (its
// slices are read through Engine::feed): `feed_stage` gets its id and nothing is returned.
// `output` names the stage Python reads when the pipeline ends in several (a tee): a sink is
// replaced, any other stage gets the iterator as one more reader. Without it, a pipeline with
// several ends is refused when `ambiguous_is_error` (an iteration), else left as it is.
spec::Stage* attach_iterator(PipelineDocument& doc, const Registry& r, std::string& feed_stage, const std::string& output = "",
                             bool ambiguous_is_error = false) {
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

// One run of a pipeline: its engine, its metrics server, and the queue its iterator reads.
class Runner {
 public:
  Runner(const std::string& text, const std::string& file, const std::map<std::string, std::string>& sets,
         std::optional<std::uint64_t> seed, const std::vector<std::string>& plugin_dirs, const std::string& metrics_addr, bool iterate,
         std::uint64_t first_epoch, std::optional<int> worker_index, std::optional<int> num_workers,
         const std::string& output, const std::string& resume, const std::vector<std::string>& resume_job) {
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
        return;
      }
    }
    Registry* r = nullptr;
    try {
      r = &loaded_registry(plugin_dirs);
    } catch (const Error& e) {
      throw py::value_error(e.what());
    }
    PipelineDocument doc = document_of(text, file, sets, seed);
    const WorkerIdentity worker = worker_of(worker_index, num_workers);
    if (iterate)
      if (spec::Stage* sink = attach_iterator(doc, *r, feed_stage_, output, true)) {
        queue_stage(*sink);
        iterator_id_ = sink->id();
      }
    try {
      // One of several workers: this worker's shard (or seed), as `sluice run` makes it; after
      // the iterator took the sink's place, whose output path then is not written.
      for (const auto& warning : plan_for_worker(doc, *r, worker).warnings)
        std::fprintf(stderr, "sluice: warning: %s\n", printable(warning).c_str());
    } catch (const SpecError& e) {
      forget_queue();
      raise_spec_error(e);
    }
    spec_ = doc.spec;
    std::optional<Graph> graph;
    try {
      graph = build_graph(doc, *r);
    } catch (const SpecError& e) {
      forget_queue();
      raise_spec_error(e);
    }
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
      engine_->start();
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
        if (follows_rows_) keep_rows_of(sample);
        if (drop_left_ == 0) break;
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

  std::string snapshot_json() {
    if (engine_) return snapshot_to_json(engine_->snapshot());
    return snapshot_to_json(final_);
  }
  std::string report() {
    if (engine_) return format_report(engine_->snapshot());
    return format_report(final_);
  }
  std::string spec_text() const { return pipeline_to_text(spec_); }

  // Where the iteration stands, as the bytes of a checkpoint: positions only, never elements. The
  // latest cut of the engine that the loop has gone past (or where this run began), plus how many
  // outputs the loop took after it: a resumed run makes those again and drops them, as every
  // output is a function of the seed and the positions. Each call also asks the engine for a new
  // cut, in the background, so that the next state is taken from close behind the loop.
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
    }
    state.clear_undelivered();
    state.set_outputs_to_skip(after);
    state.set_python_state(true);
    name_taken_records(state, base_output);
    std::string bytes;
    state.SerializeToString(&bytes);
    return py::bytes(bytes);
  }
  bool running() const { return engine_ != nullptr; }

 private:
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
    if (cuts_.size() > 2) cuts_.erase(cuts_.begin());  // the two latest: the loop is past one of them
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
    if (const auto* stacked = rows_carried(origin)) {
      rows.reserve(stacked->size());
      for (const Origin& row : *stacked) rows.push_back({row.where, row.record});
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

  checkpoint::Checkpoint base_;
  std::vector<std::string> continued_job_;  // the states of another job this run continues
  bool follows_rows_ = false;  // its states name the records taken after the cut
  std::deque<std::vector<TakenRow>> taken_rows_;
  std::uint64_t taken_first_ = 0;
  std::size_t taken_row_count_ = 0;
  std::string iterator_id_;
  std::uint64_t consumed_ = 0, drop_left_ = 0;
  std::vector<Cut> cuts_;
  std::future<std::optional<checkpoint::Checkpoint>> cut_in_flight_;
};

}  // namespace
}  // namespace sluice::python

PYBIND11_MODULE(_sluice, m) {
  using namespace sluice;
  using namespace sluice::python;
  m.doc() = "The native part of the sluice package: runs pipelines on Sluice's engine.";
  // NumPy's C API (pybind11 initialises it in a function-local static) and traceback are loaded
  // here, on the importing thread: loaded first by two engine workers at once, the static's guard
  // and the import lock wait on each other.
  py::module_::import("numpy");
  (void)py::array(py::dtype::of<std::uint8_t>(), std::vector<py::ssize_t>{0});
  py::module_::import("traceback");

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

  m.def("worker_identity", [](std::optional<int> index, std::optional<int> count) {
    const WorkerIdentity id = worker_of(index, count);
    return py::make_tuple(id.index, id.count, id.origin());
  }, py::arg("worker_index") = std::nullopt, py::arg("num_workers") = std::nullopt,
     "(index, count, source) of this process among the job's workers, from the arguments or the launcher's variables.");

  m.def("spec_from_json", [](const std::string& json) {
    try {
      return pipeline_to_text(parse_pipeline(json, "built in Python").spec);
    } catch (const SpecError& e) {
      raise_spec_error(e);
    }
  });

  m.def("read_remote_text", [](const std::string& uri) { return read_remote_text(uri); }, py::call_guard<py::gil_scoped_release>(),
        "A whole remote object (s3://, gs://, http(s)://) as text, read with the environment's settings (metadata files).");
  m.def("list_remote", [](const std::string& prefix) { return list_remote(prefix); }, py::call_guard<py::gil_scoped_release>(),
        "The URIs of the objects under an s3:// or gs:// prefix, sorted.");

  m.def("hold", [](py::object object, const std::string& name) { return hold_object(std::move(object), name); }, py::arg("object"),
        py::arg("name") = "",
        "Keeps a Python object (a stage's function, a dict of arrays) under a handle a spec can name.");
  m.def("forget", [](const std::string& handle) { forget_object(handle); });

  py::class_<DlTensor>(m, "Tensor", "A field of a batch, exported through DLPack without a copy (torch.from_dlpack, numpy.from_dlpack, JAX, CuPy).")
      .def("__dlpack__", [](const DlTensor& t, py::object stream) {
        // DLPack's stream: the consumer's CUDA stream (1 the legacy default, 2 per-thread, -1 "do
        // not synchronise"). Only a device slice's slot cares where it is read.
        if (t.slot) {
          // None means the legacy default stream (1) to DLPack. (Emulated slices are host memory
          // their feed ignores streams for, waited for when they were handed out.)
          const std::intptr_t value = stream.is_none() ? (t.device_type == kDLCUDA ? 1 : -1) : stream.cast<std::intptr_t>();
          if (value != -1) t.slot->consumer_stream.store(reinterpret_cast<void*>(value));
          if (t.device_type == kDLCUDA) t.slot->make_ready(value);
        }
        return to_dlpack(t);
      }, py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const DlTensor& t) { return py::make_tuple(t.device_type, t.device_id); })
      .def_property_readonly("shape", [](const DlTensor& t) { return py::tuple(py::cast(std::vector<std::int64_t>(t.shape.begin(), t.shape.end()))); })
      .def_property_readonly("dtype", [](const DlTensor& t) { return std::string(dtype_name(t.dtype)); })
      .def_property_readonly("device", [](const DlTensor& t) {
        return t.device_type == kDLCPU ? std::string("cpu") : "cuda:" + std::to_string(t.device_id);
      })
      .def_property_readonly("data_ptr", [](const DlTensor& t) {
        if (t.slot) t.slot->make_ready(std::nullopt);  // a raw pointer's reader may be anywhere
        return reinterpret_cast<std::uintptr_t>(t.data);
      }, "The address of the first element (for a feed slice: once its copies are complete).")
      .def("numpy", [](const DlTensor& t) -> py::object {
        if (t.device_type != kDLCPU) throw py::value_error("a device tensor has no NumPy view; use torch.from_dlpack or cupy.from_dlpack");
        return numpy_view(t.data, t.dtype, t.shape, t);
      }, "A NumPy array over the same memory.");

  py::class_<Runner>(m, "Runner")
      .def(py::init<const std::string&, const std::string&, const std::map<std::string, std::string>&, std::optional<std::uint64_t>,
                    const std::vector<std::string>&, const std::string&, bool, std::uint64_t, std::optional<int>, std::optional<int>,
                    const std::string&, const std::string&, const std::vector<std::string>&>(),
           py::arg("text"), py::arg("file"), py::arg("sets"), py::arg("seed"), py::arg("plugin_dirs"), py::arg("metrics_addr"),
           py::arg("iterate"), py::arg("first_epoch") = 0, py::arg("worker_index") = std::nullopt,
           py::arg("num_workers") = std::nullopt, py::arg("output") = "", py::arg("resume") = "",
           py::arg("resume_job") = std::vector<std::string>{})
      .def("next", &Runner::next, py::arg("arrays") = true)
      .def("checkpoint", &Runner::checkpoint)
      .def_property_readonly("running", &Runner::running)
      .def("close", &Runner::close, py::arg("patience") = py::none())
      .def("run_to_end", &Runner::run_to_end)
      .def("snapshot_json", &Runner::snapshot_json)
      .def("report", &Runner::report)
      .def("spec_text", &Runner::spec_text)
      .def_property_readonly("metrics_url", &Runner::metrics_url);
}
