#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/buffer.hpp"
#include "sluice/error.hpp"

namespace sluice {

enum class DType : std::uint8_t { U8, I16, I32, I64, F16, BF16, F32, F64, Bytes };

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::U8: return 1;
    case DType::I16: case DType::F16: case DType::BF16: return 2;
    case DType::I32: case DType::F32: return 4;
    case DType::I64: case DType::F64: return 8;
    case DType::Bytes: return 0;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::U8: return "u8";
    case DType::I16: return "i16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::Bytes: return "bytes";
  }
  return "?";
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<std::uint8_t>() { return DType::U8; }
template <> constexpr DType dtype_of<std::int16_t>() { return DType::I16; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }

using Shape = std::vector<std::int64_t>;

/// The number of elements of a shape. Shapes come from files and parameters: a negative
/// dimension or a count that would overflow is an Error, never a wrapped-around small number.
inline std::int64_t shape_elements(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d < 0) throw Error("shape has a negative dimension (" + std::to_string(d) + ")");
    if (__builtin_mul_overflow(n, d, &n)) throw Error("shape's element count overflows 64 bits");
  }
  return n;
}

inline std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

/// A typed n-dimensional view of a reference-counted buffer. Fixed-size dtypes are dense row-major.
/// Bytes tensors hold variable-length strings: element i spans [offsets[i], offsets[i+1]) past the
/// tensor's byte offset, so a record view of a large read buffer costs no copy. A scalar view
/// (bytes_view) needs no offsets at all: it spans its nbytes, and costs no allocation.
class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(DType dtype, Shape shape, Allocator& allocator = HostAllocator::instance()) {
    if (dtype == DType::Bytes) throw Error("Tensor::empty cannot make a bytes tensor; use from_strings");
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    if (__builtin_mul_overflow(static_cast<std::size_t>(shape_elements(t.shape_)), dtype_size(dtype), &t.nbytes_))
      throw Error("a tensor of shape " + shape_string(t.shape_) + " would not fit in memory");
    t.buffer_ = allocator.allocate(t.nbytes_);
    return t;
  }

  template <class T> static Tensor scalar(T value, Allocator& allocator = HostAllocator::instance()) {
    Tensor t = empty(dtype_of<T>(), {}, allocator);
    *t.data<T>() = value;
    return t;
  }

  template <class T> static Tensor from_vector(const std::vector<T>& values, Shape shape = {}) {
    if (shape.empty()) shape = {static_cast<std::int64_t>(values.size())};
    if (shape_elements(shape) != static_cast<std::int64_t>(values.size()))
      throw Error("Tensor::from_vector: " + std::to_string(values.size()) + " values do not fill shape " +
                  shape_string(shape));
    Tensor t = empty(dtype_of<T>(), std::move(shape));
    if (!values.empty()) std::memcpy(t.raw_data(), values.data(), t.nbytes_);
    return t;
  }

  /// Bytes tensor of the given strings (shape defaults to [n], or a scalar when `scalar` and n == 1).
  static Tensor from_strings(const std::vector<std::string_view>& values, Shape shape) {
    if (shape_elements(shape) != static_cast<std::int64_t>(values.size()))
      throw Error("Tensor::from_strings: " + std::to_string(values.size()) + " strings do not fill shape " +
                  shape_string(shape));
    std::size_t total = 0;
    for (auto v : values) total += v.size();
    Tensor t;
    t.dtype_ = DType::Bytes;
    t.shape_ = std::move(shape);
    t.buffer_ = HostAllocator::instance().allocate(total);
    auto offsets = std::make_shared<std::uint64_t[]>(values.size() + 1);
    std::uint64_t at = 0;
    offsets[0] = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!values[i].empty()) std::memcpy(t.buffer_->data() + at, values[i].data(), values[i].size());
      at += values[i].size();
      offsets[i + 1] = at;
    }
    t.offsets_ = std::shared_ptr<const std::uint64_t>(offsets, offsets.get());
    t.nbytes_ = total;
    return t;
  }
  static Tensor from_string(std::string_view value) { return from_strings({value}, {}); }

  /// A scalar bytes tensor viewing [offset, offset + size) of an existing buffer, without a copy.
  static Tensor bytes_view(std::shared_ptr<Buffer> buffer, std::size_t offset, std::size_t size) {
    if (!buffer || offset + size > buffer->size()) throw Error("Tensor::bytes_view: range outside the buffer");
    Tensor t;
    t.dtype_ = DType::Bytes;
    t.buffer_ = std::move(buffer);
    t.offset_ = offset;
    t.nbytes_ = size;
    return t;
  }

  /// A dense tensor over an existing buffer (used by operators that assemble into their own memory).
  static Tensor view(DType dtype, Shape shape, std::shared_ptr<Buffer> buffer, std::size_t offset = 0) {
    if (dtype == DType::Bytes) throw Error("Tensor::view: use bytes_view for bytes");
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    t.nbytes_ = static_cast<std::size_t>(shape_elements(t.shape_)) * dtype_size(dtype);
    if (!buffer || offset + t.nbytes_ > buffer->size()) throw Error("Tensor::view: shape does not fit the buffer");
    t.buffer_ = std::move(buffer);
    t.offset_ = offset;
    return t;
  }

  bool valid() const { return static_cast<bool>(buffer_); }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  std::size_t rank() const { return shape_.size(); }
  std::int64_t num_elements() const { return shape_elements(shape_); }
  std::size_t nbytes() const { return nbytes_; }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  std::size_t byte_offset() const { return offset_; }

  std::byte* raw_data() { return buffer_->data() + offset_; }
  const std::byte* raw_data() const { return buffer_->data() + offset_; }
  template <class T> T* data() {
    check_type<T>();
    return reinterpret_cast<T*>(raw_data());
  }
  template <class T> const T* data() const {
    check_type<T>();
    return reinterpret_cast<const T*>(raw_data());
  }
  template <class T> T item() const {
    if (num_elements() != 1) throw Error("Tensor::item: tensor of shape " + shape_string(shape_) + " is not a single value");
    return *data<T>();
  }

  /// Element i of a bytes tensor (row-major over the shape).
  std::string_view string_at(std::int64_t i) const {
    if (dtype_ != DType::Bytes) throw Error(std::string("Tensor::string_at on a ") + dtype_name(dtype_) + " tensor");
    const std::uint64_t begin = string_offset(i);
    return {reinterpret_cast<const char*>(raw_data()) + begin, static_cast<std::size_t>(string_offset(i + 1) - begin)};
  }
  /// Where element i of a bytes tensor starts, in bytes past byte_offset(); i == num_elements() gives
  /// the end of the last one.
  std::uint64_t string_offset(std::int64_t i) const {
    if (!offsets_) return i == 0 ? 0 : nbytes_;
    return offsets_.get()[i];
  }

  /// Rows [begin, end) along the first dimension, sharing the buffer.
  Tensor slice(std::int64_t begin, std::int64_t end) const {
    if (shape_.empty() || begin < 0 || end > shape_[0] || begin > end)
      throw Error("Tensor::slice [" + std::to_string(begin) + "," + std::to_string(end) + ") outside shape " +
                  shape_string(shape_));
    std::int64_t row = 1;
    for (std::size_t d = 1; d < shape_.size(); ++d) row *= shape_[d];
    Tensor t = *this;
    t.shape_[0] = end - begin;
    if (dtype_ == DType::Bytes) {
      const auto first = string_offset(begin * row);
      const std::int64_t count = (end - begin) * row;
      auto sub = std::make_shared<std::uint64_t[]>(static_cast<std::size_t>(count) + 1);
      for (std::int64_t i = 0; i <= count; ++i) sub[i] = string_offset(begin * row + i) - first;
      t.offset_ = offset_ + first;
      t.nbytes_ = sub[count];
      t.offsets_ = std::shared_ptr<const std::uint64_t>(sub, sub.get());
    } else {
      t.offset_ = offset_ + static_cast<std::size_t>(begin * row) * dtype_size(dtype_);
      t.nbytes_ = static_cast<std::size_t>((end - begin) * row) * dtype_size(dtype_);
    }
    return t;
  }

  /// Row i along the first dimension, with that dimension removed.
  Tensor row(std::int64_t i) const {
    Tensor t = slice(i, i + 1);
    t.shape_.erase(t.shape_.begin());
    return t;
  }

 private:
  template <class T> void check_type() const {
    if (dtype_of<T>() != dtype_)
      throw Error(std::string("tensor holds ") + dtype_name(dtype_) + ", read as " + dtype_name(dtype_of<T>()));
  }

  DType dtype_ = DType::U8;
  Shape shape_;
  std::shared_ptr<Buffer> buffer_;
  std::size_t offset_ = 0;
  std::size_t nbytes_ = 0;
  std::shared_ptr<const std::uint64_t> offsets_;  ///< num_elements() + 1 of them; null for a scalar view
};

}  // namespace sluice
