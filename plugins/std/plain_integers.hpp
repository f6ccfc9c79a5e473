#pragma once
// Whitespace-separated decimal integers (pre-tokenized text: token ids, one sequence per line)
// read in the pass that finds them. split_text uses it, and so does bench_sequences' plain loop,
// which must parse as fast as the fastest reader we have.
#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace sluice::std_ops {

// Tab, line feed, vertical tab, form feed, carriage return: with space, what str.split() splits at.
inline bool is_other_blank(char c) { return static_cast<unsigned char>(c - '\t') <= '\r' - '\t'; }

namespace plain_integers_detail {

static_assert(std::endian::native == std::endian::little, "the 8-byte reads take the first byte as the lowest");

constexpr std::uint64_t bytes_of(std::uint8_t b) { return 0x0101010101010101ull * b; }

// How many of the 8 bytes of `word` (the first byte the lowest) are decimal digits before the
// first that is not: 0 to 8. A digit (0x30 to 0x39) is the one byte whose high nibble is 3 and
// stays 3 when 6 is added; the two nibbles side by side are 0x33 for a digit only. Adding 6 to a
// byte above 0xF9 carries into the next byte, but that byte is past the first non-digit already.
inline unsigned leading_digits(std::uint64_t word) {
  constexpr std::uint64_t high = bytes_of(0xF0);
  const std::uint64_t nibbles = (word & high) | (((word + bytes_of(0x06)) & high) >> 4);
  const std::uint64_t differs = nibbles ^ bytes_of(0x33);  // 0 in each digit byte
  // The top bit of each byte that is not 0 (the low seven bits plus 0x7F cannot carry out of the byte).
  const std::uint64_t not_digit = (((differs & bytes_of(0x7F)) + bytes_of(0x7F)) | differs) & bytes_of(0x80);
  return not_digit ? static_cast<unsigned>(__builtin_ctzll(not_digit)) / 8 : 8;
}

// The value of the first `n` bytes of `word`, 1 to 8 decimal digits, the first the most
// significant: three multiplications join neighbours into pairs, fours and eights, where a loop
// over the digits would wait on one multiplication per digit.
inline std::uint64_t digits_value(std::uint64_t word, unsigned n) {
  // Each digit as 0 to 9 (a digit byte never borrows from the next); the bytes after the digits
  // are shifted out, and zeros come in before them, as leading zeros.
  std::uint64_t v = (word - bytes_of('0')) << (8 * (8 - n));
  v = (v * 10 + (v >> 8)) & 0x00FF00FF00FF00FFull;     // each 16 bits: 10 * first + second
  v = (v * 100 + (v >> 16)) & 0x0000FFFF0000FFFFull;   // each 32 bits: 100 * first pair + second
  return (v * 10000 + (v >> 32)) & 0xFFFFFFFFull;       // 10000 * first four + second
}

}  // namespace plain_integers_detail

// Calls append(value) for each integer of `text`, in order: an optional sign, then 1 to 18
// digits, each integer ended by a blank or the end of the text, blanks in runs of any length.
// Returns false at anything else (a sign alone, a letter, more than 18 digits), having appended
// the integers before it: the caller then drops them and reads the text some other way.
// Integers of fewer than 8 digits are read 8 bytes at a time where 8 bytes remain in the text
// (never a byte past its end); longer ones and the text's last few bytes digit by digit.
template <class Append> bool read_plain_integers(std::string_view text, Append&& append) {
  using namespace plain_integers_detail;
  const char* p = text.data();
  const char* const end = p + text.size();
  while (p != end) {
    if (*p == ' ' || is_other_blank(*p)) {
      ++p;
      continue;
    }
    const bool negative = *p == '-';
    if (negative || *p == '+') ++p;
    std::uint64_t value = 0;
    std::uint64_t word = 0;
    unsigned digits = 8;
    if (end - p >= 8) {
      std::memcpy(&word, p, 8);
      digits = leading_digits(word);
    }
    if (digits == 0) return false;
    if (digits < 8) {  // p + digits is still inside the text
      value = digits_value(word, digits);
      p += digits;
    } else {
      const char* const first = p;
      while (p != end && static_cast<unsigned char>(*p - '0') < 10) value = value * 10 + static_cast<unsigned>(*p++ - '0');
      if (static_cast<std::size_t>(p - first) - 1 >= 18) return false;  // no digit, or more than 18
    }
    // The blank after a number is taken with it, a space tested before the other blanks.
    if (p != end) {
      if (*p == ' ') ++p;
      else if (!is_other_blank(*p)) return false;
    }
    append(negative ? -static_cast<std::int64_t>(value) : static_cast<std::int64_t>(value));
  }
  return true;
}

}  // namespace sluice::std_ops
