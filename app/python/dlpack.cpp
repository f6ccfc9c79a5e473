// Tensors handed to any DLPack consumer (torch, NumPy, JAX, CuPy) without a copy: host buffers and
// feed slices, whose slot goes back to the feed when the last tensor made from it is dropped.
#include "native.hpp"

namespace sluice::python {

// ---- DLPack ------------------------------------------------------------------------------------

// Said once per process: the run goes on correctly, only with the host waiting for each copy.
void warn_once_about_host_waits(const std::string& why) {
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "sluice: feed slices are waited for on the host, not on the consumer's CUDA stream: %s\n", why.c_str());
  });
}




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

void bind_tensor(py::module_& m) {
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
}

}  // namespace sluice::python
