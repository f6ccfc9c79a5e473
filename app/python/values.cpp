// Python objects the stages call, kept by handle; tensors between NumPy and the engine (NumPy
// arrays over a tensor's own memory, and engine tensors made from Python values).
#include "native.hpp"

namespace sluice::python {

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

namespace {

py::object field_value(const google::protobuf::Message& message, const google::protobuf::FieldDescriptor* field, int index) {
  using F = google::protobuf::FieldDescriptor;
  const auto* reflection = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case F::CPPTYPE_INT32: return py::int_(repeated ? reflection->GetRepeatedInt32(message, field, index) : reflection->GetInt32(message, field));
    case F::CPPTYPE_INT64: return py::int_(repeated ? reflection->GetRepeatedInt64(message, field, index) : reflection->GetInt64(message, field));
    case F::CPPTYPE_UINT32: return py::int_(repeated ? reflection->GetRepeatedUInt32(message, field, index) : reflection->GetUInt32(message, field));
    case F::CPPTYPE_UINT64: return py::int_(repeated ? reflection->GetRepeatedUInt64(message, field, index) : reflection->GetUInt64(message, field));
    case F::CPPTYPE_DOUBLE: return py::float_(repeated ? reflection->GetRepeatedDouble(message, field, index) : reflection->GetDouble(message, field));
    case F::CPPTYPE_FLOAT: return py::float_(repeated ? reflection->GetRepeatedFloat(message, field, index) : reflection->GetFloat(message, field));
    case F::CPPTYPE_BOOL: return py::bool_(repeated ? reflection->GetRepeatedBool(message, field, index) : reflection->GetBool(message, field));
    case F::CPPTYPE_ENUM: return py::str((repeated ? reflection->GetRepeatedEnum(message, field, index) : reflection->GetEnum(message, field))->name());
    case F::CPPTYPE_STRING: {
      const std::string text = repeated ? reflection->GetRepeatedString(message, field, index) : reflection->GetString(message, field);
      if (field->type() == F::TYPE_BYTES) return py::bytes(text);
      return py::str(text);
    }
    case F::CPPTYPE_MESSAGE:
      return message_to_python(repeated ? reflection->GetRepeatedMessage(message, field, index) : reflection->GetMessage(message, field));
  }
  return py::none();
}

}  // namespace

py::dict message_to_python(const google::protobuf::Message& message) {
  py::dict out;
  const auto* descriptor = message.GetDescriptor();
  const auto* reflection = message.GetReflection();
  for (int f = 0; f < descriptor->field_count(); ++f) {
    const auto* field = descriptor->field(f);
    if (field->is_map()) {  // as protobuf's JSON writes a map: a dict
      py::dict entries;
      const auto* key = field->message_type()->map_key();
      const auto* value = field->message_type()->map_value();
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        const auto& entry = reflection->GetRepeatedMessage(message, field, i);
        entries[field_value(entry, key, -1)] = field_value(entry, value, -1);
      }
      out[py::str(field->name())] = std::move(entries);
    } else if (field->is_repeated()) {
      py::list items;
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) items.append(field_value(message, field, i));
      out[py::str(field->name())] = std::move(items);
    } else {
      out[py::str(field->name())] = field_value(message, field, -1);
    }
  }
  return out;
}

}  // namespace sluice::python
