#pragma once
// The one binary form of a Sample: its fields (name, dtype, shape, values) and its origin (where,
// record, byte offset), little-endian as the machine lays it out. Checkpoints keep elements by
// value in it, the service's workers send elements in it, and the `cache` operator writes its
// files in it; a plugin that must keep samples whole may use it too.
//
// Decoding trusts no length it reads: each is checked against the bytes still there before any
// memory is taken, so a damaged or hostile input is refused (DataError naming `what`), never
// allocated blindly.
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/buffer.hpp"
#include "sluice/error.hpp"
#include "sluice/sample.hpp"
#include "sluice/tensor.hpp"

namespace sluice {

// The bytes of an encoded sample, read in order. They need not lie in one piece: a message
// received in pieces is decoded where it lies, each tensor's data copied once, into its tensor.
class SampleBytesIn {
 public:
  virtual ~SampleBytesIn() = default;
  virtual std::size_t remaining() const = 0;
  // The next `size` bytes into `out`; DataError (naming what is read) past the end.
  virtual void read(void* out, std::size_t size) = 0;
  // The next `size` bytes in one piece: where they lie when they are contiguous, else gathered
  // into `scratch`.
  virtual std::string_view view(std::size_t size, std::string& scratch) = 0;
};

// An encoded sample held in one string.
class SampleBytesOfString final : public SampleBytesIn {
 public:
  SampleBytesOfString(const std::string& bytes, const std::string& what) : bytes_(bytes), what_(what) {}
  std::size_t remaining() const override { return bytes_.size() - at_; }
  void read(void* out, std::size_t size) override {
    if (size > remaining())
      throw DataError(what_ + " is damaged: it ends " + std::to_string(size - remaining()) + " bytes early (at byte " +
                      std::to_string(at_) + ")");
    std::memcpy(out, bytes_.data() + at_, size);
    at_ += size;
  }
  std::string_view view(std::size_t size, std::string&) override {
    if (size > remaining())
      throw DataError(what_ + " is damaged: a length of " + std::to_string(size) + " bytes at byte " + std::to_string(at_));
    std::string_view v(bytes_.data() + at_, size);
    at_ += size;
    return v;
  }

 private:
  const std::string& bytes_;
  const std::string& what_;
  std::size_t at_ = 0;
};

// The size of `sample`'s encoding.
inline std::size_t encoded_sample_size(const Sample& sample) {
  std::size_t size = 8;
  for (const auto& field : sample.fields()) {
    const Tensor& t = field.tensor;
    size += 8 + field.name.size() + 1 + 8 + 8 * t.rank();
    if (t.dtype() == DType::Bytes) {
      for (std::int64_t i = 0; i < t.num_elements(); ++i) size += 8 + t.string_at(i).size();
    } else {
      size += t.nbytes();
    }
  }
  const Origin& origin = sample.shared_origin();
  return size + 8 + (origin.where ? origin.where->size() : 0) + 16;
}

// Hands `sample`'s encoding to `put(const void* data, std::size_t size)`, piece by piece.
template <class Put>
void encode_sample(const Sample& sample, Put&& put) {
  auto put_u64 = [&](std::uint64_t v) { put(&v, sizeof v); };
  auto put_string = [&](std::string_view s) {
    put_u64(s.size());
    if (!s.empty()) put(s.data(), s.size());
  };
  put_u64(sample.size());
  for (const auto& field : sample.fields()) {
    const Tensor& t = field.tensor;
    put_string(field.name);
    const auto dtype = static_cast<std::uint8_t>(t.dtype());
    put(&dtype, 1);
    put_u64(t.rank());
    for (auto d : t.shape()) put_u64(static_cast<std::uint64_t>(d));
    if (t.dtype() == DType::Bytes) {
      for (std::int64_t i = 0; i < t.num_elements(); ++i) put_string(t.string_at(i));
    } else if (t.nbytes() > 0) {
      put(t.raw_data(), t.nbytes());
    }
  }
  const Origin& origin = sample.shared_origin();
  put_string(origin.where ? std::string_view(*origin.where) : std::string_view());
  put_u64(static_cast<std::uint64_t>(origin.record));
  put_u64(static_cast<std::uint64_t>(origin.byte_offset));
}

inline std::string encode_sample(const Sample& sample) {
  // Its size first: a batch of images is tens of megabytes, which a growing string would copy
  // several times over.
  std::string out;
  out.reserve(encoded_sample_size(sample));
  encode_sample(sample, [&](const void* data, std::size_t size) { out.append(static_cast<const char*>(data), size); });
  return out;
}

// Its tensors from `allocator` (a pool's reused blocks, pinned memory for a GPU feed).
inline Sample decode_sample(SampleBytesIn& in, const std::string& what, Allocator& allocator = HostAllocator::instance()) {
  auto damaged = [&](const std::string& why) { return DataError(what + " is damaged: " + why); };
  auto u64 = [&] {
    std::uint64_t v = 0;
    in.read(&v, sizeof v);
    return v;
  };
  std::deque<std::string> gathered;  // pieces that did not lie in one piece (stable while the views are used)
  auto view = [&](std::uint64_t size) {
    if (size > in.remaining())
      throw damaged("a length of " + std::to_string(size) + " bytes with " + std::to_string(in.remaining()) + " left");
    return in.view(static_cast<std::size_t>(size), gathered.emplace_back());
  };
  const std::uint64_t fields = u64();
  if (fields > 4096) throw damaged(std::to_string(fields) + " fields");
  Sample sample;
  sample.reserve(static_cast<std::size_t>(fields));
  for (std::uint64_t f = 0; f < fields; ++f) {
    std::string name(view(u64()));
    std::uint8_t dtype = 0;
    in.read(&dtype, 1);
    if (dtype > static_cast<std::uint8_t>(DType::Bytes)) throw damaged("dtype " + std::to_string(dtype));
    const std::uint64_t rank = u64();
    if (rank > 32) throw damaged("rank " + std::to_string(rank));
    Shape shape(rank);
    for (auto& d : shape) {
      const std::uint64_t dim = u64();
      if (dim > in.remaining() * 8 + 1) throw damaged("dimension " + std::to_string(dim));
      d = static_cast<std::int64_t>(dim);
    }
    std::int64_t count = 0;
    try {
      count = shape_elements(shape);
    } catch (const Error&) {
      throw damaged("shape " + shape_string(shape));
    }
    if (static_cast<DType>(dtype) == DType::Bytes) {
      if (static_cast<std::uint64_t>(count) > in.remaining() / 8) throw damaged("shape " + shape_string(shape));
      std::vector<std::string_view> views(static_cast<std::size_t>(count));
      for (auto& v : views) v = view(u64());
      sample.set(std::move(name), Tensor::from_strings(views, shape));
      gathered.clear();
    } else {
      const std::uint64_t size = static_cast<std::uint64_t>(count) * dtype_size(static_cast<DType>(dtype));
      if (size > in.remaining())
        throw damaged("field '" + name + "' of " + std::to_string(size) + " bytes with " + std::to_string(in.remaining()) + " left");
      Tensor t = Tensor::empty(static_cast<DType>(dtype), shape, allocator);
      if (size) in.read(t.raw_data(), size);
      sample.set(std::move(name), std::move(t));
    }
  }
  std::string where(view(u64()));
  const auto record = static_cast<std::int64_t>(u64());
  const auto offset = static_cast<std::int64_t>(u64());
  if (!where.empty()) sample.set_origin(std::make_shared<const std::string>(std::move(where)), record, offset);
  return sample;
}

inline Sample decode_sample(const std::string& bytes, const std::string& what, Allocator& allocator = HostAllocator::instance()) {
  SampleBytesOfString in(bytes, what);
  return decode_sample(in, what, allocator);
}

}  // namespace sluice
