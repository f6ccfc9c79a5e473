#include "sample_codec.hpp"

#include <sys/stat.h>

#include <cstring>

namespace sluice::std_ops {
namespace {

void put(std::FILE* f, const void* data, std::size_t n) {
  if (n && std::fwrite(data, 1, n, f) != n) throw Error("writing the cache file failed (disk full?)");
}
void put_u64(std::FILE* f, std::uint64_t v) { put(f, &v, sizeof v); }
void put_string(std::FILE* f, std::string_view s) {
  put_u64(f, s.size());
  put(f, s.data(), s.size());
}

// Every length read from a cache file is checked against the bytes the file still holds before
// memory is taken for it: a damaged or hostile file is refused, never allocated blindly.
struct Reader {
  std::FILE* f;
  const std::string& name;
  std::uint64_t file_size;
  std::uint64_t remaining() const {
    const long at = std::ftell(f);
    return at < 0 || static_cast<std::uint64_t>(at) > file_size ? 0 : file_size - static_cast<std::uint64_t>(at);
  }
  [[noreturn]] void malformed(const std::string& what) const {
    throw DataError("cache file " + name + " is malformed (" + what + " at byte " + std::to_string(std::ftell(f)) +
                    "); delete it and its .complete marker to rebuild it");
  }
  void get(void* data, std::size_t n) {
    if (n && std::fread(data, 1, n, f) != n)
      throw DataError("cache file " + name + " is truncated at byte " + std::to_string(std::ftell(f)) +
                      " (delete it and its .complete marker to rebuild it)");
  }
  std::uint64_t u64() {
    std::uint64_t v;
    get(&v, sizeof v);
    return v;
  }
  std::string string(std::uint64_t limit = 1ull << 34) {
    std::uint64_t n = u64();
    if (n > limit || n > remaining()) malformed("a length of " + std::to_string(n) + " bytes");
    std::string s(n, '\0');
    get(s.data(), n);
    return s;
  }
};

}  // namespace

void write_sample(std::FILE* f, const Sample& sample) {
  put_u64(f, sample.size());
  for (const auto& field : sample.fields()) {
    const Tensor& t = field.tensor;
    put_string(f, field.name);
    std::uint8_t dtype = static_cast<std::uint8_t>(t.dtype());
    put(f, &dtype, 1);
    put_u64(f, t.rank());
    for (auto d : t.shape()) put_u64(f, static_cast<std::uint64_t>(d));
    if (t.dtype() == DType::Bytes) {
      for (std::int64_t i = 0; i < t.num_elements(); ++i) put_string(f, t.string_at(i));
    } else {
      put(f, t.raw_data(), t.nbytes());
    }
  }
  put_string(f, sample.origin());
}

bool read_sample(std::FILE* f, Sample& sample, const std::string& name, std::int64_t file_size) {
  std::uint64_t fields = 0;
  std::size_t got = std::fread(&fields, 1, sizeof fields, f);
  if (got == 0 && std::feof(f)) return false;
  if (got != sizeof fields) throw DataError("cache file " + name + " is truncated; delete it to rebuild it");
  struct stat st {};
  if (file_size < 0) file_size = ::fstat(::fileno(f), &st) == 0 ? st.st_size : 0;
  Reader r{f, name, static_cast<std::uint64_t>(file_size)};
  if (fields > 4096) r.malformed(std::to_string(fields) + " fields");
  sample = Sample();
  for (std::uint64_t i = 0; i < fields; ++i) {
    std::string field_name = r.string(1 << 20);
    std::uint8_t dtype = 0;
    r.get(&dtype, 1);
    if (dtype > static_cast<std::uint8_t>(DType::Bytes)) r.malformed("dtype " + std::to_string(dtype));
    std::uint64_t rank = r.u64();
    if (rank > 32) r.malformed("rank " + std::to_string(rank));
    Shape shape(rank);
    for (auto& d : shape) {
      const std::uint64_t dim = r.u64();
      if (dim > (1ull << 62)) r.malformed("dimension " + std::to_string(dim));
      d = static_cast<std::int64_t>(dim);
    }
    std::int64_t count = 0;
    try {
      count = shape_elements(shape);
    } catch (const Error&) {
      r.malformed("shape " + shape_string(shape));
    }
    // Each value takes at least its 8-byte length (bytes) or its size (numbers) in the file.
    const std::uint64_t per_value = static_cast<DType>(dtype) == DType::Bytes ? 8 : dtype_size(static_cast<DType>(dtype));
    if (per_value && static_cast<std::uint64_t>(count) > r.remaining() / per_value) r.malformed("shape " + shape_string(shape));
    if (static_cast<DType>(dtype) == DType::Bytes) {
      std::vector<std::string> strings(static_cast<std::size_t>(count));
      for (auto& s : strings) s = r.string();
      std::vector<std::string_view> views(strings.begin(), strings.end());
      sample.set(field_name, Tensor::from_strings(views, shape));
    } else {
      Tensor t = Tensor::empty(static_cast<DType>(dtype), shape);
      r.get(t.raw_data(), t.nbytes());
      sample.set(field_name, std::move(t));
    }
  }
  sample.set_origin(r.string(1 << 20));
  return true;
}

}  // namespace sluice::std_ops
