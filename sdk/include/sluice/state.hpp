#pragma once
/// (ABI 6.0) Checkpoints: what an operator that keeps state between elements writes so that a run
/// can stop and later continue exactly where it was (see Operator::save_state).
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "sluice/error.hpp"
#include "sluice/sample.hpp"

namespace sluice {

/// Receives one operator's state. Plain values go in as bytes, in an order the operator reads
/// back the same way; the elements it holds (a shuffle buffer, a partial batch) go in with
/// put_element(), which lets the host keep them as it sees fit.
class StateWriter {
 public:
  virtual ~StateWriter() = default;
  virtual void put_bytes(const void* data, std::size_t size) = 0;
  /// An element the operator holds; read back with StateReader::get_element() in the same place.
  /// The host may keep an element whose origin has a read position (Origin::read_index) as a
  /// reference to the record it was made from, and make it again on resume: an element the
  /// operator built itself from several (a partial batch, a packed row) must not carry one (set
  /// its origin with Sample::set_origin, which has none), or it comes back as the first of them.
  virtual void put_element(const Sample& element) = 0;
  /// One line for `sluice checkpoint info` ("1000 elements held, 4 drawn"); the last one counts.
  virtual void describe(std::string text) = 0;

  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "put() takes plain values; use put_string for text");
    put_bytes(&value, sizeof value);
  }
  void put_string(std::string_view text) {
    put<std::uint64_t>(text.size());
    put_bytes(text.data(), text.size());
  }
};

/// Gives back what a StateWriter received, in the same order. Reading past the end, or a value
/// that does not fit, throws DataError (a damaged or foreign checkpoint).
class StateReader {
 public:
  virtual ~StateReader() = default;
  virtual void get_bytes(void* data, std::size_t size) = 0;
  virtual Sample get_element() = 0;

  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>, "get() reads plain values; use get_string for text");
    std::array<std::byte, sizeof(T)> raw;
    get_bytes(raw.data(), raw.size());
    return std::bit_cast<T>(raw);
  }
  /// A position or count read back and checked against what the operator can hold (a pass of
  /// `count` elements cannot be at element count + 1): a checkpoint whose checksum was made to
  /// fit after its positions were changed is refused, naming `what`, instead of resuming
  /// somewhere that never was.
  template <typename T>
  T get_within(T lowest, T highest, std::string_view what) {
    static_assert(std::is_arithmetic_v<T>, "get_within() checks numbers");
    const T value = get<T>();
    if (!(value >= lowest && value <= highest))
      throw DataError("checkpoint state: " + std::string(what) + " is " + std::to_string(value) + ", outside " + std::to_string(lowest) +
                      ".." + std::to_string(highest) + ": the checkpoint is damaged or not this pipeline's");
    return value;
  }
  std::string get_string() {
    const auto size = get<std::uint64_t>();
    if (size > (std::uint64_t{1} << 32)) throw DataError("checkpoint state holds a string of " + std::to_string(size) + " bytes: it is damaged");
    std::string text(static_cast<std::size_t>(size), '\0');
    get_bytes(text.data(), text.size());
    return text;
  }
};

}  // namespace sluice
