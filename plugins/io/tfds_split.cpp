#include "tfds_split.hpp"

#include <cmath>
#include <numeric>
#include <optional>


#include "sluice/error.hpp"
#include "text_scan.hpp"

namespace sluice::io {
namespace {

enum class Unit { Absolute, Percent, Shard };

struct Bound {
  std::optional<double> value;  // absent: the split's start or end
  std::optional<Unit> unit;     // absent: no unit written
};

struct Slice {
  std::string split;
  std::optional<double> from, to;
  Unit unit = Unit::Absolute;
};

[[noreturn]] void refuse(const std::string& spec, std::string why) {
  // A part that is the whole expression is named once: "split 'train[:120%]': percent ...".
  if (why.compare(0, spec.size() + 4, "'" + spec + "': ") == 0) why.erase(0, spec.size() + 4);
  throw ParamError("split '" + spec + "': " + why + " (TFDS's forms: train, train[:4000], train[-1000:], train[25%:75%], "
                   "train[:4shard], train[4shard], train[:25%]+test, all)");
}

// -?DIGITS[.DIGITS], then % or shard or nothing.
Bound parse_bound(const std::string& spec, const std::string& text) {
  if (text.empty()) return {};
  Bound b;
  std::string_view number(text);
  if (number.size() > 1 && number.back() == '%') {
    b.unit = Unit::Percent;
    number.remove_suffix(1);
  } else if (number.size() > 5 && number.substr(number.size() - 5) == "shard") {
    b.unit = Unit::Shard;
    number.remove_suffix(5);
  }
  const std::size_t dot = number.find('.');
  const bool fraction = dot != std::string_view::npos;
  const bool well_formed = fraction ? scan::whole_number(number.substr(0, dot)) && dot + 1 < number.size() &&
                                          scan::digits(number, dot + 1) == number.size()
                                    : scan::whole_number(number);
  if (!well_formed) refuse(spec, "'" + text + "' is not a boundary (a whole number, or a percent)");
  b.value = std::stod(std::string(number));
  if (fraction && b.unit != Unit::Percent) refuse(spec, "'" + text + "': only a percent may have a fraction");
  return b;
}

Slice parse_part(const std::string& spec, const std::string& part) {
  // NAME or NAME[SELECTOR], NAME of word characters and '-', SELECTOR without ']'.
  const std::size_t open = part.find('[');
  const bool bracketed = open != std::string::npos;
  if (!scan::name(std::string_view(part).substr(0, open), "-") ||
      (bracketed && (part.back() != ']' || part.find(']', open) != part.size() - 1)))
    refuse(spec, "'" + part + "' is not SPLIT or SPLIT[SLICE]");
  Slice s;
  s.split = part.substr(0, open);
  if (!bracketed) return s;
  const std::string selector = part.substr(open + 1, part.size() - open - 2);
  const auto colon = selector.find(':');
  if (colon == std::string::npos) {  // train[4shard]: one shard
    const Bound b = parse_bound(spec, selector);
    if (!b.value || b.unit != Unit::Shard) refuse(spec, "'" + part + "': a single index must be a shard (as 4shard); slice examples or percents with ':'");
    s.from = *b.value;
    s.to = *b.value + 1;
    s.unit = Unit::Shard;
    return s;
  }
  if (selector.find(':', colon + 1) != std::string::npos) refuse(spec, "'" + part + "' has more than one ':'");
  const Bound from = parse_bound(spec, selector.substr(0, colon)), to = parse_bound(spec, selector.substr(colon + 1));
  if (!from.value && !to.value) refuse(spec, "'" + part + "' selects nothing between its brackets");
  s.from = from.value;
  s.to = to.value;
  // As TFDS: the unit written on either side is the slice's.
  s.unit = from.unit ? *from.unit : to.unit ? *to.unit : Unit::Absolute;
  if (s.unit == Unit::Percent && (std::abs(s.from.value_or(0)) > 100 || std::abs(s.to.value_or(0)) > 100))
    refuse(spec, "'" + part + "': percent boundaries must lie between -100% and 100%");
  return s;
}

std::int64_t percent_to_index(double percent, std::uint64_t examples, SplitRounding rounding, const std::string& spec) {
  if (rounding == SplitRounding::Closest)  // Python's round(): halves to even, as the default mode does
    return static_cast<std::int64_t>(std::nearbyint(percent * static_cast<double>(examples) / 100.0));
  if (examples < 100) refuse(spec, "pct1_dropremainder rounding needs a split of at least 100 examples (this one has " + std::to_string(examples) + ")");
  return static_cast<std::int64_t>(std::trunc(percent * static_cast<double>(examples / 100)));
}

// The sum of the first `index` shard lengths, `index` read as a Python slice end (negative from
// the end, clamped).
std::uint64_t examples_before_shard(std::int64_t index, const std::vector<std::uint64_t>& lengths) {
  const auto count = static_cast<std::int64_t>(lengths.size());
  if (index < 0) index = std::max<std::int64_t>(0, count + index);
  index = std::min(index, count);
  return std::accumulate(lengths.begin(), lengths.begin() + index, std::uint64_t{0});
}

SplitRange to_range(const Slice& s, const SplitShards& split, SplitRounding rounding, const std::string& spec) {
  const std::uint64_t examples = std::accumulate(split.shard_lengths.begin(), split.shard_lengths.end(), std::uint64_t{0});
  const auto n = static_cast<std::int64_t>(examples);
  std::int64_t from = 0, to = n;
  switch (s.unit) {
    case Unit::Percent:
      if (s.from) from = percent_to_index(*s.from, examples, rounding, spec);
      if (s.to) to = percent_to_index(*s.to, examples, rounding, spec);
      break;
    case Unit::Shard: {
      if (s.from) from = static_cast<std::int64_t>(examples_before_shard(static_cast<std::int64_t>(*s.from), split.shard_lengths));
      if (s.to) {
        auto end = static_cast<std::int64_t>(*s.to);
        if (end <= 0) end += static_cast<std::int64_t>(split.shard_lengths.size());
        to = static_cast<std::int64_t>(examples_before_shard(end, split.shard_lengths));
      }
      break;
    }
    case Unit::Absolute:
      if (s.from) from = static_cast<std::int64_t>(*s.from);
      if (s.to) to = static_cast<std::int64_t>(*s.to);
      break;
  }
  if (std::abs(from) > n || std::abs(to) > n)
    refuse(spec, "the slice [" + (s.from ? std::to_string(from) : "") + ":" + (s.to ? std::to_string(to) : "") + "] of split '" + s.split +
                     "' exceeds its " + std::to_string(examples) + " examples");
  if (from < 0) from += n;
  if (to < 0) to += n;
  return {s.split, static_cast<std::uint64_t>(from), static_cast<std::uint64_t>(std::max(from, to))};
}

std::vector<std::string> parts_of(const std::string& spec) {  // split at '+', spaces around it dropped
  std::vector<std::string> parts;
  if (spec.empty()) return parts;
  const bool union_of_parts = spec.find('+') != std::string::npos;
  for (std::size_t start = 0;;) {
    const std::size_t plus = spec.find('+', start);
    const std::string_view part = std::string_view(spec).substr(start, plus == std::string::npos ? std::string::npos : plus - start);
    parts.emplace_back(union_of_parts ? scan::trimmed(part) : part);
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  return parts;
}

}  // namespace

std::vector<SplitRange> resolve_split(const std::string& spec, const std::vector<SplitShards>& splits, SplitRounding rounding) {
  auto find = [&](const std::string& name) -> const SplitShards* {
    for (const auto& s : splits)
      if (s.name == name) return &s;
    return nullptr;
  };
  std::vector<SplitRange> ranges;
  for (const std::string& part : parts_of(spec)) {
    const Slice slice = parse_part(spec, part);
    if (slice.split == "all") {
      if (part != "all") refuse(spec, "'all' takes no slice (TFDS refuses it too): slice each split and join them with '+'");
      for (const auto& s : splits) ranges.push_back(to_range(Slice{s.name, {}, {}, Unit::Absolute}, s, rounding, spec));
      continue;
    }
    const SplitShards* split = find(slice.split);
    if (!split) {
      std::string names;
      for (const auto& s : splits) names += (names.empty() ? "" : ", ") + s.name;
      refuse(spec, "the dataset has no split '" + slice.split + "' (it has: " + names + ")");
    }
    ranges.push_back(to_range(slice, *split, rounding, spec));
  }
  return ranges;
}

std::vector<ShardRead> shard_reads(const SplitRange& range, const SplitShards& split) {
  std::vector<ShardRead> reads;
  std::uint64_t start = 0;
  for (std::size_t shard = 0; shard < split.shard_lengths.size(); ++shard) {
    const std::uint64_t end = start + split.shard_lengths[shard];
    const std::uint64_t from = std::max(start, range.from), to = std::min(end, range.to);
    if (from < to) reads.push_back({split.name, shard, from - start, to - from});
    start = end;
  }
  return reads;
}

}  // namespace sluice::io
