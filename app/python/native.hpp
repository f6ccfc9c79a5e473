#pragma once
// What the files of sluice._sluice share (module.cpp binds them to Python): Python objects kept by
// handle and tensors between NumPy and the engine (values.cpp), the host operators that call
// Python (python_operators.cpp), the plugins and errors (loading.cpp), DLPack (dlpack.cpp) and a
// run (runner.cpp). Included only by those files.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlpack/dlpack.h>
#include <google/protobuf/message.h>
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
#include "sluice/core/lineage.hpp"
#include "sluice/core/param_parse.hpp"
#include "sluice/core/prepare.hpp"
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

// ---- values.cpp: Python objects by handle, tensors between C++ and Python ----
// Handles are numbered in one sequence (objects held, and a run's queue).
extern std::atomic<std::uint64_t> g_next_handle;
std::string hold_object(py::object object, const std::string& name);
void forget_object(const std::string& handle);
py::object object_of(const std::string& handle);
bool interpreter_alive();
py::dtype numpy_dtype(DType dtype);
std::vector<py::ssize_t> strides_of(const Shape& shape, std::size_t item);
DType dtype_of_numpy(const py::dtype& dtype, const std::string& field);
bool is_text_array(const py::handle& value);
Tensor text_from_numpy(const py::array& array, const std::string& field);
py::object to_python(const Tensor& tensor);
py::dict to_python(const Sample& sample);
// A message as a dict with every field, zeros and empty lists included, and numbers as numbers
// (protobuf's JSON leaves zeros out and writes 64-bit integers as strings): metrics snapshots.
py::dict message_to_python(const google::protobuf::Message& message);
// A delivery ledger's verdicts: a dict per epoch (runner.cpp).
py::list verdicts_to_python(const std::vector<EpochVerdict>& verdicts);
// A ledger's bytes (Runner.ledger_bytes()), checked; ValueError naming it by `what`.
DeliveryLedger ledger_from_bytes(const std::string& bytes, const std::string& what);
Tensor from_python(const py::handle& value, const std::string& field);
Sample sample_from_python(const py::handle& result, const std::string& what);
[[noreturn]] void rethrow_python_error(py::error_already_set& e, const std::string& what);

// ---- python_operators.cpp: the stages that call Python, and the iterator's sink ----
std::string python_calls_now();
[[noreturn]] void wait_for_the_process_to_end();
py::object call_python(const py::object& function, py::object argument = py::object());
void add_host_operators(Registry& r);
// Between the engine's sink thread and Python's next(): a QueueSink over a short ElementQueue
// (sluice/core/element_queue.hpp), so that the pipeline runs ahead of the training step by its
// own buffers, not by an unbounded list here.
using PythonIterator = QueueSink;

// ---- loading.cpp: plugins, errors, the pipeline file ----
Registry& loaded_registry(const std::vector<std::string>& extra);
extern py::object g_spec_error, g_pipeline_error;
[[noreturn]] void raise_spec_error(const SpecError& e);
[[noreturn]] void raise_pipeline_error(const std::string& message, const std::string& stage);
WorkerIdentity worker_of(std::optional<int> index, std::optional<int> count);
// The face's options of prepare_pipeline (sluice/core/prepare.hpp): overrides, seed, the service's split.
PrepareOptions prepare_options(const std::map<std::string, std::string>& sets, std::optional<std::uint64_t> seed);
PipelineDocument document_of(const std::string& text, const std::string& file, const std::map<std::string, std::string>& sets,
                             std::optional<std::uint64_t> seed);

// ---- dlpack.cpp ----
void warn_once_about_host_waits(const std::string& why);

// ---- runner.cpp ----
spec::Stage* attach_iterator(PipelineDocument& doc, const Registry& r, std::string& feed_stage, const std::string& output = "",
                             bool ambiguous_is_error = false);

// ---- the bindings, one function per part (module.cpp calls them) ----
void bind_tensor(py::module_& m);
void bind_runner(py::module_& m);
void bind_positioned(py::module_& m);

// A NumPy array over `data`; `owner` (freed with the array) keeps the memory alive.
template <class Owner>
py::array numpy_view(void* data, DType dtype, const Shape& shape, Owner owner) {
  auto* held = new Owner(std::move(owner));
  py::capsule base(held, [](void* p) { delete static_cast<Owner*>(p); });
  return py::array(numpy_dtype(dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()), strides_of(shape, dtype_size(dtype)),
                   data, base);
}

// A stage's Python object as messages name it ("the function of stage 'm'"), and how many engine
// threads are inside a call of it now, so that a run that cannot stop says which function holds
// it. A site is registered once, when its stage starts; a call only counts up and down.
struct PythonCallSite {
  std::string what;
  std::atomic<int> inside{0};
};

struct InPythonCall {
  explicit InPythonCall(PythonCallSite& site) : site(site) { ++site.inside; }
  ~InPythonCall() { --site.inside; }
  PythonCallSite& site;
};

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

py::capsule to_dlpack(const DlTensor& t);
DlTensor dl_tensor_of(const Tensor& tensor);

}  // namespace sluice::python
