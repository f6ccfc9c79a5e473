#pragma once
/// The origins of many rows, kept as runs: a stage that gathers rows (batch; the host's record of
/// a stacking stage's rows) keeps one `where` per run of rows read from one place, and the rows'
/// records, byte offsets and read positions as numbers: as a first value and a count where they
/// follow one another (the rows of a Parquet row group: records counting up, one byte offset),
/// else one of each per row. A batch of 65,536 rows read in order from one file holds one run, not
/// 65,536 copies of the file name's shared pointer whose counts every core updates, nor 65,536
/// rows of numbers. Header-only: nothing of it crosses the plugin boundary.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "sluice/chunk.hpp"
#include "sluice/sample.hpp"

namespace sluice {

class RowOrigins {
 public:
  std::size_t size() const { return static_cast<std::size_t>(end_ - first_); }
  bool empty() const { return end_ == first_; }

  /// One row (an element): it joins the last run when it is from the same place, listed there when
  /// it does not follow (elements of a TFRecord file, each at its own byte offset).
  void push_back(const Origin& o) {
    if (!runs_.empty()) {
      Run& last = runs_.back();
      const bool same_place = same_where(last.where, o.where) && last.read_epoch == o.read_epoch;
      if (same_place && !last.listed && last.rows == 1 && !last.follows(o.record, o.byte_offset, o.read_index)) last.list();
      if (same_place && last.listed) {
        last.records.push_back(o.record);
        last.byte_offsets.push_back(o.byte_offset);
        last.read_indices.push_back(o.read_index);
        ++last.rows;
        ++end_;
        return;
      }
    }
    add_counted(o.where, o.read_epoch, o.record, o.byte_offset, o.read_index, 1);
  }
  /// Rows [begin, end) of `chunk`, in order.
  void append(const Chunk& chunk, std::size_t begin, std::size_t end) {
    if (begin >= end) return;
    const std::size_t n = end - begin;
    const std::int64_t record = chunk.records().empty() ? -1 : chunk.records()[begin];
    const std::int64_t byte_offset = chunk.byte_offsets().empty() ? -1 : chunk.byte_offsets()[begin];
    const std::int64_t read_index = chunk.read_index_of(begin);
    bool counted = true;
    for (std::size_t k = 1; k < n && counted; ++k) {
      const std::size_t r = begin + k;
      counted = (chunk.records().empty() || chunk.records()[r] == next_of(record, k)) &&
                (chunk.byte_offsets().empty() || chunk.byte_offsets()[r] == byte_offset) && chunk.read_index_of(r) == next_of(read_index, k);
    }
    if (counted) return add_counted(chunk.where(), chunk.read_epoch(), record, byte_offset, read_index, n);
    Run run{end_, n, chunk.where(), chunk.read_epoch(), -1, -1, -1, true, {}, {}, {}};
    run.records.reserve(n);
    run.byte_offsets.reserve(n);
    run.read_indices.reserve(n);
    for (std::size_t r = begin; r < end; ++r) {
      run.records.push_back(chunk.records().empty() ? -1 : chunk.records()[r]);
      run.byte_offsets.push_back(chunk.byte_offsets().empty() ? -1 : chunk.byte_offsets()[r]);
      run.read_indices.push_back(chunk.read_index_of(r));
    }
    runs_.push_back(std::move(run));
    end_ += n;
  }

  /// Row `k` (0: the first still kept).
  Origin operator[](std::size_t k) const {
    const std::uint64_t at = first_ + k;
    const Run& run = *run_of(at);
    return run.row(static_cast<std::size_t>(at - run.begin));
  }
  /// The first `n` rows (all there are, if fewer), in order, and no longer kept.
  std::vector<Origin> take_front(std::size_t n) {
    n = std::min(n, size());
    std::vector<Origin> out;
    if (n == 0) return out;
    out.reserve(n);
    for (auto run = run_of(first_); out.size() < n; ++run)
      for (std::uint64_t at = std::max(first_, run->begin); at < run->begin + run->rows && out.size() < n; ++at)
        out.push_back(run->row(static_cast<std::size_t>(at - run->begin)));
    first_ += n;
    while (!runs_.empty() && runs_.front().begin + runs_.front().rows <= first_) runs_.pop_front();
    return out;
  }
  /// The last `n` rows no longer kept (rows taken back).
  void drop_back(std::size_t n) {
    n = std::min(n, size());
    end_ -= n;
    while (!runs_.empty() && runs_.back().begin >= end_) runs_.pop_back();
    if (runs_.empty()) return;
    Run& last = runs_.back();
    last.rows = static_cast<std::size_t>(end_ - last.begin);
    if (last.listed) {
      last.records.resize(last.rows);
      last.byte_offsets.resize(last.rows);
      last.read_indices.resize(last.rows);
    }
  }
  /// `rows` kept before the rows there are (rows restored from a checkpoint).
  void push_front(const std::vector<Origin>& rows) {
    if (rows.empty()) return;
    RowOrigins all;
    for (const Origin& row : rows) all.push_back(row);
    for (std::size_t k = 0; k < size(); ++k) all.push_back((*this)[k]);
    *this = std::move(all);
  }
  void clear() {
    runs_.clear();
    first_ = end_ = 0;
  }

 private:
  // Rows [begin, begin + rows) (numbered from the first row ever kept). Counted: row k's record is
  // record + k, its read index read_index + k (each -1 when it is -1), its byte offset byte_offset.
  // Listed: one of each per row.
  struct Run {
    std::uint64_t begin;
    std::size_t rows;
    std::shared_ptr<const std::string> where;
    std::uint64_t read_epoch;
    std::int64_t record, byte_offset, read_index;
    bool listed;
    std::vector<std::int64_t> records, byte_offsets, read_indices;
    // Whether a row with these numbers would be the next of this counted run.
    bool follows(std::int64_t next_record, std::int64_t next_byte_offset, std::int64_t next_read_index) const {
      return byte_offset == next_byte_offset && next_record == next_of(record, rows) && next_read_index == next_of(read_index, rows);
    }
    // The counted run's rows written out one by one (rows that do not follow are to join it).
    void list() {
      for (std::size_t k = 0; k < rows; ++k) {
        records.push_back(next_of(record, k));
        byte_offsets.push_back(byte_offset);
        read_indices.push_back(next_of(read_index, k));
      }
      listed = true;
    }
    Origin row(std::size_t k) const {
      Origin o{where, listed ? records[k] : next_of(record, k), listed ? byte_offsets[k] : byte_offset};
      o.read_epoch = read_epoch;
      o.read_index = listed ? read_indices[k] : next_of(read_index, k);
      return o;
    }
  };
  // One `where` and the same owner: an origin's `where` can carry what only its element has (the
  // records of a batch, draw keys, a read epoch) in its control block, around the same text.
  static bool same_where(const std::shared_ptr<const std::string>& a, const std::shared_ptr<const std::string>& b) {
    return a == b && !a.owner_before(b) && !b.owner_before(a);
  }
  static std::int64_t next_of(std::int64_t first, std::size_t k) { return first < 0 ? -1 : first + static_cast<std::int64_t>(k); }
  void add_counted(const std::shared_ptr<const std::string>& where, std::uint64_t read_epoch, std::int64_t record, std::int64_t byte_offset,
                   std::int64_t read_index, std::size_t n) {
    if (!runs_.empty()) {
      Run& last = runs_.back();
      if (!last.listed && same_where(last.where, where) && last.read_epoch == read_epoch && last.follows(record, byte_offset, read_index)) {
        last.rows += n;
        end_ += n;
        return;
      }
    }
    runs_.push_back(Run{end_, n, where, read_epoch, record, byte_offset, read_index, false, {}, {}, {}});
    end_ += n;
  }
  std::deque<Run>::const_iterator run_of(std::uint64_t at) const {
    return std::upper_bound(runs_.begin(), runs_.end(), at, [](std::uint64_t row, const Run& r) { return row < r.begin; }) - 1;
  }
  std::deque<Run> runs_;
  std::uint64_t first_ = 0, end_ = 0;  // the rows kept: [first_, end_)
};

}  // namespace sluice
