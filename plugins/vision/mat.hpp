#pragma once
// Between Sluice tensors (HWC, row-major) and OpenCV matrices, without copying where possible.
#include <opencv2/core.hpp>

#include "sluice/sdk.hpp"

namespace sluice::vision {

inline int cv_depth(DType t) {
  switch (t) {
    case DType::U8: return CV_8U;
    case DType::I16: return CV_16S;
    case DType::I32: return CV_32S;
    case DType::F32: return CV_32F;
    case DType::F64: return CV_64F;
    default: throw DataError(std::string("images of dtype ") + dtype_name(t) + " are not supported here");
  }
}

inline DType sluice_dtype(int depth) {
  switch (depth) {
    case CV_8U: return DType::U8;
    case CV_16S: return DType::I16;
    case CV_32S: return DType::I32;
    case CV_32F: return DType::F32;
    case CV_64F: return DType::F64;
    default: throw DataError("unsupported OpenCV depth " + std::to_string(depth));
  }
}

// A view of an HWC (or HW) tensor; the tensor must outlive it.
inline cv::Mat as_mat(const Tensor& t, const std::string& field) {
  if (t.rank() != 3 && t.rank() != 2)
    throw DataError("field '" + field + "' has shape " + shape_string(t.shape()) + "; an image is HxWxC (decode it first)");
  int channels = t.rank() == 3 ? static_cast<int>(t.shape()[2]) : 1;
  if (channels < 1 || channels > 4) throw DataError("field '" + field + "' has " + std::to_string(channels) + " channels (1 to 4 supported)");
  return cv::Mat(static_cast<int>(t.shape()[0]), static_cast<int>(t.shape()[1]), CV_MAKETYPE(cv_depth(t.dtype()), channels),
                 const_cast<std::byte*>(t.raw_data()));
}

// A tensor sharing the matrix's memory (the buffer keeps the matrix alive).
inline Tensor from_mat(const cv::Mat& m) {
  cv::Mat owned = m.isContinuous() ? m : m.clone();
  std::size_t bytes = owned.total() * owned.elemSize();
  auto buffer = std::make_shared<Buffer>(reinterpret_cast<std::byte*>(owned.data), bytes,
                                         [keep = owned](std::byte*, std::size_t) mutable { keep.release(); });
  return Tensor::view(sluice_dtype(owned.depth()), {owned.rows, owned.cols, owned.channels()}, std::move(buffer));
}

}  // namespace sluice::vision
