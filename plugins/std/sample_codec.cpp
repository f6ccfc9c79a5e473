#include "sample_codec.hpp"

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

struct Reader {
  std::FILE* f;
  const std::string& name;
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
    if (n > limit) throw DataError("cache file " + name + " holds an impossible length; delete it to rebuild it");
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

bool read_sample(std::FILE* f, Sample& sample, const std::string& name) {
  std::uint64_t fields = 0;
  std::size_t got = std::fread(&fields, 1, sizeof fields, f);
  if (got == 0 && std::feof(f)) return false;
  if (got != sizeof fields) throw DataError("cache file " + name + " is truncated; delete it to rebuild it");
  Reader r{f, name};
  if (fields > 4096) throw DataError("cache file " + name + " is malformed; delete it to rebuild it");
  sample = Sample();
  for (std::uint64_t i = 0; i < fields; ++i) {
    std::string field_name = r.string(1 << 20);
    std::uint8_t dtype = 0;
    r.get(&dtype, 1);
    if (dtype > static_cast<std::uint8_t>(DType::Bytes)) throw DataError("cache file " + name + " is malformed (dtype)");
    std::uint64_t rank = r.u64();
    if (rank > 32) throw DataError("cache file " + name + " is malformed (rank)");
    Shape shape(rank);
    for (auto& d : shape) d = static_cast<std::int64_t>(r.u64());
    if (static_cast<DType>(dtype) == DType::Bytes) {
      std::vector<std::string> strings(static_cast<std::size_t>(shape_elements(shape)));
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
