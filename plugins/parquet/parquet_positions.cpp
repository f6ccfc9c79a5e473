// parquet_rows: every row of some Parquet files, each with its place in their order, read in
// order by a pipeline or at the places a caller chooses (ReadsByPosition: sluice.data's
// load_dataset("parquet", ...)). Rows are read a row group at a time, through Arrow, and the
// groups read are kept (up to cache_bytes) for the next reads.
#include <algorithm>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <utility>

#include "file_patterns.hpp"
#include "parquet_format.hpp"
#include "sluice/sdk.hpp"

namespace sluice::parquet_files {
namespace {

class ParquetRows final : public Source, public ReadsByPosition, public KnowsItsRecords, public StartsAnywhere {
 public:
  static OperatorInfo describe() {
    return {"parquet_rows",
            OperatorKind::Source,
            "Every row of the Parquet files the patterns name, in their order, as parquet_reader gives them; each row can be read "
            "by its place alone (what sluice.data.load_dataset(\"parquet\", ...) reads with): row groups read once are kept for the "
            "next reads. Sharded by position: each worker reads its own run of rows",
            with_column_params(
                {ParamSpec::make("patterns", ParamType::PathList, "files, as list_files takes them (globs, {a,b} and {000..009})").def("")},
                {ParamSpec::make("cache_bytes", ParamType::Int, "row groups kept once read, up to this many bytes (at least the last one)")
                     .def("268435456")
                     .range(0, std::nullopt),
                 ParamSpec::make("num_shards", ParamType::Int, "number of shards; -1: the number of workers of the job")
                     .def("-1")
                     .range(-1, std::nullopt)
                     .takes_hint("num_workers"),
                 ParamSpec::make("index", ParamType::Int, "this worker's shard, 0 <= index < num_shards; -1: this worker's index")
                     .def("-1")
                     .range(-1, std::nullopt)
                     .takes_hint("worker_index")}),
            {.stateless = false, .saves_state = true},
            {}};
  }
  explicit ParquetRows(const Params& p)
      : patterns_(p.get_string_list("patterns")), options_(read_options_of(p)), cache_bytes_(static_cast<std::uint64_t>(p.get_int("cache_bytes"))) {
    shards_ = p.get_int("num_shards");
    if (shards_ == 0) throw ParamError("num_shards is 0; use 1 or more, or -1 for the number of workers");
    if (shards_ < 0) shards_ = 1;
    shard_ = std::max<std::int64_t>(0, p.get_int("index"));
    if (shard_ >= shards_) throw ParamError("index " + std::to_string(shard_) + " must be less than num_shards " + std::to_string(shards_));
  }

  void start(const StageInfo& info) override {
    if (patterns_.empty()) throw ParamError("patterns is empty; give at least one Parquet file or glob pattern");
    files_.clear();
    first_row_.assign(1, 0);
    cache_.clear();
    cached_bytes_ = 0;
    for (const io::MatchedFile& file : io::match_files(patterns_, info.storage)) {
      files_.push_back(std::make_unique<ParquetFileReader>(file.path, open_arrow_file(file.path, info.storage), options_));
      first_row_.push_back(first_row_.back() + static_cast<std::uint64_t>(files_.back()->rows()));
    }
  }

  // A pipeline's pass: this shard's run of rows [begin, end) of them all, in order.
  void begin_pass(std::uint64_t) override { next_ = shard_begin(); }
  void begin_pass_at(std::uint64_t pass, std::uint64_t index) override {
    begin_pass(pass);
    next_ = std::min(shard_end(), shard_begin() + index);
  }
  std::int64_t expected_elements() const override { return static_cast<std::int64_t>(shard_end() - shard_begin()); }
  bool next(Sample& out, const ElementContext&) override {
    if (next_ >= shard_end()) return false;
    out = row_at(next_++);
    return true;
  }
  void save_state(StateWriter& w) const override {
    w.put<std::uint64_t>(records());
    w.put<std::uint64_t>(next_ - shard_begin());
    w.describe(std::to_string(next_ - shard_begin()) + " of " + std::to_string(shard_end() - shard_begin()) + " rows");
  }
  void restore_state(StateReader& r) override {
    const auto rows = r.get<std::uint64_t>();
    if (rows != records())
      throw Error("the checkpoint's run read " + std::to_string(rows) + " rows, the patterns now give " + std::to_string(records()) + ": resume over the same files");
    next_ = shard_begin() + r.get_within<std::uint64_t>(0, shard_end() - shard_begin(), "the next row's place");
  }

  std::uint64_t records() const override { return first_row_.back(); }
  std::vector<Sample> read_positions(const std::vector<std::uint64_t>& positions) override {
    std::vector<Sample> out;
    out.reserve(positions.size());
    for (const std::uint64_t place : positions) {
      if (place >= records())
        throw DataError("row " + std::to_string(place) + " is past the " + std::to_string(records()) + " rows of " + describe_files());
      out.push_back(row_at(place));
    }
    return out;
  }
  std::vector<StoredField> stored_fields() const override {
    std::vector<StoredField> out;
    if (!files_.empty())
      for (auto& [name, type] : files_.front()->stored_fields()) out.push_back({name, type});
    return out;
  }
  std::vector<FileRecords> records_per_file() const override {
    std::vector<FileRecords> out;
    for (const auto& file : files_) out.push_back({file->name(), 0, file->rows()});
    return out;
  }

 private:
  // This shard's run of rows: shards get equal runs, the first ones a row more.
  std::uint64_t shard_begin() const { return run_start(static_cast<std::uint64_t>(shard_)); }
  std::uint64_t shard_end() const { return run_start(static_cast<std::uint64_t>(shard_ + 1)); }
  std::uint64_t run_start(std::uint64_t shard) const {
    const std::uint64_t total = records(), shards = static_cast<std::uint64_t>(shards_);
    return shard * (total / shards) + std::min(shard, total % shards);
  }
  std::string describe_files() const {
    return files_.size() == 1 ? files_[0]->name() : std::to_string(files_.size()) + " files" + (files_.empty() ? "" : " (" + files_[0]->name() + " ...)");
  }

  // A row group read: its rows as the reader's chunks (each within the group).
  struct CachedGroup {
    std::vector<Chunk> chunks;
    std::vector<std::uint64_t> first;  // each chunk's first row, within the file
    std::size_t bytes = 0;
  };
  using GroupKey = std::pair<std::size_t, int>;  // file, row group

  Sample row_at(std::uint64_t place) {
    const auto f = static_cast<std::size_t>(std::upper_bound(first_row_.begin(), first_row_.end(), place) - first_row_.begin() - 1);
    const auto row = static_cast<std::int64_t>(place - first_row_[f]);
    const CachedGroup& group = group_of(f, files_[f]->group_of_row(row));
    const auto c = static_cast<std::size_t>(std::upper_bound(group.first.begin(), group.first.end(), static_cast<std::uint64_t>(row)) - group.first.begin() - 1);
    return group.chunks[c].row(static_cast<std::size_t>(static_cast<std::uint64_t>(row) - group.first[c]));
  }
  // The row group, from the cache or read whole (the least recently used ones let go beyond
  // cache_bytes, the group just read always kept).
  const CachedGroup& group_of(std::size_t f, int g) {
    const GroupKey key{f, g};
    if (auto it = cache_.find(key); it != cache_.end()) {
      recent_.splice(recent_.begin(), recent_, it->second.second);
      return it->second.first;
    }
    ParquetFileReader& file = *files_[f];
    CachedGroup group;
    const std::int64_t end = g + 1 < file.row_groups() ? file.group_first_row(g + 1) : file.rows();
    file.start_at(file.group_first_row(g));
    for (std::int64_t row = file.group_first_row(g); row < end;) {
      Chunk chunk;
      if (!file.next_chunk(chunk, static_cast<std::size_t>(end - row)))
        throw DataError(file.name() + ": row group " + std::to_string(g) + " ends at row " + std::to_string(row) + " where its metadata says " + std::to_string(end));
      group.first.push_back(static_cast<std::uint64_t>(row));
      row += static_cast<std::int64_t>(chunk.rows());
      group.bytes += chunk.nbytes();
      group.chunks.push_back(std::move(chunk));
    }
    while (!recent_.empty() && cached_bytes_ + group.bytes > cache_bytes_) {
      cached_bytes_ -= cache_.at(recent_.back()).first.bytes;
      cache_.erase(recent_.back());
      recent_.pop_back();
    }
    recent_.push_front(key);
    cached_bytes_ += group.bytes;
    return cache_.emplace(key, std::make_pair(std::move(group), recent_.begin())).first->second.first;
  }

  std::vector<std::string> patterns_;
  ReadOptions options_;
  std::uint64_t cache_bytes_;
  std::int64_t shards_ = 1, shard_ = 0;
  std::vector<std::unique_ptr<ParquetFileReader>> files_;
  std::vector<std::uint64_t> first_row_;  // each file's first row among all; back(): the total
  std::map<GroupKey, std::pair<CachedGroup, std::list<GroupKey>::iterator>> cache_;
  std::list<GroupKey> recent_;  // most recently read first
  std::uint64_t cached_bytes_ = 0;
  std::uint64_t next_ = 0;
};

}  // namespace

void register_parquet_rows(Registrar& registrar) { registrar.add<ParquetRows>(); }

}  // namespace sluice::parquet_files
