// text_lines (tf.data's TextLineDataset) and fixed_length_records (FixedLengthRecordDataset).
#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include "byte_source.hpp"
#include "io_plugin.hpp"

namespace sluice::io {
namespace {

ParamSpec compression_param() {
  return ParamSpec::make("compression", ParamType::Choice, "auto detects gzip and zlib from the first bytes")
      .def("auto")
      .one_of({"auto", "none", "gzip", "zlib"});
}

// Reads a byte stream in chunks. What is handed out views a chunk (no copy); what runs past the
// end of a chunk is moved into the next one, which grows to hold it.
class ChunkedInput {
 public:
  ChunkedInput(std::unique_ptr<ByteSource> source, Allocator& allocator, std::size_t chunk)
      : source_(std::move(source)), allocator_(allocator), chunk_(chunk) {}
  // Bytes available from the read position, after reading more if fewer than `want` are.
  // Returns fewer only at the end of the stream.
  std::size_t fill(std::size_t want) {
    while (end_ - pos_ < want && !eof_) {
      // A larger buffer each time (doubling: a long line or record costs linear copying), never
      // more than twice what is held: a huge record_bytes on a small file allocates nothing huge.
      const std::size_t have = end_ - pos_;
      const std::size_t size = std::max(chunk_, 2 * have);
      auto next = allocator_.allocate(size);
      if (have) std::memcpy(next->data(), buffer_->data() + pos_, have);
      buffer_ = std::move(next);
      pos_ = 0;
      end_ = have;
      while (end_ < size) {
        const std::size_t got = source_->read(buffer_->data() + end_, size - end_);
        if (got == 0) {
          eof_ = true;
          break;
        }
        end_ += got;
      }
    }
    return end_ - pos_;
  }
  const char* data() const { return reinterpret_cast<const char*>(buffer_->data()) + pos_; }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  std::size_t position_in_buffer() const { return pos_; }
  void consume(std::size_t n) {
    pos_ += n;
    offset_ += n;
  }
  std::uint64_t offset() const { return offset_; }  // in the (uncompressed) stream
  bool seek(std::uint64_t offset) {
    if (!source_->seek(offset)) return false;
    buffer_.reset();
    pos_ = end_ = 0;
    eof_ = false;
    offset_ = offset;
    return true;
  }

 private:
  std::unique_ptr<ByteSource> source_;
  Allocator& allocator_;
  std::size_t chunk_;
  std::shared_ptr<Buffer> buffer_;
  std::size_t pos_ = 0, end_ = 0;
  std::uint64_t offset_ = 0;
  bool eof_ = false;
};

class TextLines final : public Expand {
 public:
  static OperatorInfo describe() {
    return {"text_lines",
            OperatorKind::Expand,
            "Reads the text file named by 'path' into one element per line ('line' bytes, without its line end); gzip too",
            {ParamSpec::make("field", ParamType::String, "field holding the path").def("path"),
             compression_param(),
             ParamSpec::make("skip_header_lines", ParamType::Int, "lines to skip at the start of each file").def("0").range(0, 1e9),
             ParamSpec::make("max_line_bytes", ParamType::Int,
                             "longest line accepted; a longer one is damage (skipped under the skip policy)")
                 .def("67108864")
                 .range(1, 1LL << 40)},
            {.stateless = true},
            {}};
  }
  explicit TextLines(const Params& p)
      : field_(p.get_string("field")),
        compression_(parse_compression(p.get_string("compression"))),
        skip_header_(p.get_int("skip_header_lines")),
        max_line_(static_cast<std::size_t>(p.get_int("max_line_bytes"))) {}

  // Lines are views of the read chunk; "\n" and "\r\n" end them; a last line without an end is a
  // line; empty lines are elements (as TextLineDataset's).
  class Lines final : public ExpandCursor, public ChunkedExpandCursor {
   public:
    Lines(std::string path, std::unique_ptr<ByteSource> source, const TextLines& op, DamageReport& damage)
        : path_(std::make_shared<const std::string>(std::move(path))),
          input_(std::move(source), op.pool_, kChunk),
          op_(op),
          damage_(damage) {}
    bool next(Sample& out) override {
      for (;;) {
        std::size_t length = 0;
        if (!find_line(length)) return false;
        const std::int64_t line = line_++;
        const std::uint64_t offset = input_.offset();
        std::size_t text = length;
        if (text > 0 && input_.data()[text - 1] == '\n') --text;
        if (text > 0 && input_.data()[text - 1] == '\r') --text;
        Tensor view = Tensor::bytes_view(input_.buffer(), input_.position_in_buffer(), text);
        input_.consume(length);
        if (line < op_.skip_header_) continue;
        out = Sample();
        out.set("line", std::move(view));
        out.set_origin(path_, line, static_cast<std::int64_t>(offset));
        return true;
      }
    }
    // The lines of one read buffer, as next() gives them: a "line" column of spans of the buffer.
    bool next_chunk(Chunk& out, std::size_t max_rows) override {
      // Damage met after some lines (a corrupt gzip stream, a line over the limit) is thrown by
      // the next call: the lines before it go on first, as next() would have given them.
      if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
      out = Chunk();
      Column* lines = nullptr;
      std::size_t rows = 0;
      while (rows < max_rows) {
        std::size_t length = 0;
        bool found = false;
        try {
          found = find_line(length);
        } catch (...) {
          if (rows == 0) throw;
          pending_error_ = std::current_exception();
          break;
        }
        if (!found) break;
        // A line that starts a new read buffer starts the next chunk (found again then: one search).
        if (lines && input_.buffer() != lines->buffer) break;
        const std::int64_t line = line_++;
        const std::uint64_t offset = input_.offset();
        std::size_t text = length;
        if (text > 0 && input_.data()[text - 1] == '\n') --text;
        if (text > 0 && input_.data()[text - 1] == '\r') --text;
        const std::size_t at = input_.position_in_buffer();
        input_.consume(length);
        if (line < op_.skip_header_) continue;
        if (!lines) {
          lines = &out.add("line", Column::Layout::Spans);
          lines->buffer = input_.buffer();
          lines->spans.reserve(max_rows);
          out.records().reserve(max_rows);
          out.byte_offsets().reserve(max_rows);
        }
        lines->spans.push_back({at, text});
        out.records().push_back(line);
        out.byte_offsets().push_back(static_cast<std::int64_t>(offset));
        ++rows;
      }
      if (rows == 0) return false;
      out.set_rows(rows);
      out.set_where(path_);
      return true;
    }
    // Line `record` starts at `byte_offset` (a position this cursor gave in an origin).
    bool seek(std::int64_t record, std::int64_t byte_offset) override {
      if (record < 0 || byte_offset < 0 || !input_.seek(static_cast<std::uint64_t>(byte_offset))) return false;
      pending_error_ = nullptr;
      line_ = record;
      return true;
    }

   private:
    static constexpr std::size_t kChunk = 1 << 20;
    // The bytes of the next line with its end in `length`; false at the end of the file. A line
    // over max_line_bytes is damage: skipped whole under the skip policy, else a DataError.
    bool find_line(std::size_t& length) {
      std::size_t searched = 0;
      for (;;) {
        const std::size_t have = input_.fill(searched + 1);  // reads on once every byte held was searched
        if (have == 0) return false;
        if (have == searched) {  // the end of the file: what is left is the last line
          length = have;
          if (have <= op_.max_line_) return true;
          too_long();
          searched = 0;
          continue;
        }
        const void* nl = std::memchr(input_.data() + searched, '\n', have - searched);
        if (nl) {
          length = static_cast<std::size_t>(static_cast<const char*>(nl) - input_.data()) + 1;
          std::size_t text = length - 1;
          if (text > 0 && input_.data()[text - 1] == '\r') --text;
          if (text <= op_.max_line_) return true;
          too_long();
          searched = 0;
          continue;
        }
        searched = have;
        if (searched > op_.max_line_ + 1) {  // (+1: the line may still end in "\r\n")
          too_long();
          searched = 0;
        }
      }
    }
    // Skips the line at the read position (reading on to its end) or throws.
    void too_long() {
      const std::string reason = *path_ + " line " + std::to_string(line_ + 1) + " (byte offset " + std::to_string(input_.offset()) +
                                 "): longer than max_line_bytes (" + std::to_string(op_.max_line_) +
                                 "); raise max_line_bytes if lines this long are expected, or check that the file is text";
      if (!damage_.skip_damaged(reason)) throw DataError(reason);
      for (;;) {
        const std::size_t have = input_.fill(1);
        if (have == 0) break;
        const void* nl = std::memchr(input_.data(), '\n', have);
        if (nl) {
          input_.consume(static_cast<std::size_t>(static_cast<const char*>(nl) - input_.data()) + 1);
          break;
        }
        input_.consume(have);
      }
      ++line_;
    }

    std::shared_ptr<const std::string> path_;
    ChunkedInput input_;
    const TextLines& op_;
    DamageReport& damage_;
    std::int64_t line_ = 0;
    std::exception_ptr pending_error_;
  };

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext& ctx, DamageReport& damage) override {
    std::string path(in.at(field_).string_at(0));
    return std::make_unique<Lines>(path, open_file(path, compression_, ctx.stage ? ctx.stage->storage : nullptr), *this, damage);
  }

 private:
  std::string field_;
  Compression compression_;
  std::int64_t skip_header_;
  std::size_t max_line_;
  mutable PooledHostAllocator pool_;
};

class FixedLengthRecords final : public Expand {
 public:
  static OperatorInfo describe() {
    return {"fixed_length_records",
            OperatorKind::Expand,
            "Reads the file named by 'path' as records of record_bytes ('record' bytes), after header_bytes and before footer_bytes",
            {ParamSpec::make("field", ParamType::String, "field holding the path").def("path"),
             ParamSpec::make("record_bytes", ParamType::Int, "bytes per record").range(1, 1LL << 31),
             ParamSpec::make("header_bytes", ParamType::Int, "bytes to skip at the start of each file").def("0").range(0, 1LL << 40),
             ParamSpec::make("footer_bytes", ParamType::Int, "bytes to ignore at the end of each file").def("0").range(0, 1LL << 40),
             compression_param()},
            {.stateless = true},
            {}};
  }
  explicit FixedLengthRecords(const Params& p)
      : field_(p.get_string("field")),
        record_(static_cast<std::size_t>(p.get_int("record_bytes"))),
        header_(static_cast<std::size_t>(p.get_int("header_bytes"))),
        footer_(static_cast<std::size_t>(p.get_int("footer_bytes"))),
        compression_(parse_compression(p.get_string("compression"))) {}

  // The footer is only known to be a footer at the end of the stream (compressed files have no
  // size up front): the cursor keeps footer_bytes read ahead of the record it hands out.
  class Records final : public ExpandCursor {
   public:
    Records(std::string path, std::unique_ptr<ByteSource> source, const FixedLengthRecords& op, DamageReport& damage)
        : path_(std::make_shared<const std::string>(std::move(path))),
          input_(std::move(source), op.pool_, 1 << 20),
          op_(op),
          damage_(damage) {}
    bool next(Sample& out) override {
      if (!header_done_) {
        if (input_.fill(op_.header_) < op_.header_)
          return fail(*path_ + ": the file has fewer than header_bytes (" + std::to_string(op_.header_) + ") bytes");
        input_.consume(op_.header_);
        header_done_ = true;
      }
      const std::size_t want = op_.record_ + op_.footer_;
      const std::size_t have = input_.fill(want);
      if (have < want) {
        if (have < op_.footer_) return fail(*path_ + ": the file ends inside its footer (" + std::to_string(have) + " of " + std::to_string(op_.footer_) + " bytes)");
        const std::size_t tail = have - op_.footer_;
        if (tail == 0) return false;
        return fail(*path_ + " record " + std::to_string(index_) + " (byte offset " + std::to_string(input_.offset()) +
                    "): truncated, " + std::to_string(tail) + " of " + std::to_string(op_.record_) +
                    " bytes before the end of the file (is record_bytes right, and header_bytes and footer_bytes?)");
      }
      out = Sample();
      out.set("record", Tensor::bytes_view(input_.buffer(), input_.position_in_buffer(), op_.record_));
      out.set_origin(path_, index_, static_cast<std::int64_t>(input_.offset()));
      input_.consume(op_.record_);
      ++index_;
      return true;
    }
    bool seek(std::int64_t record, std::int64_t byte_offset) override {
      if (record < 0 || byte_offset < 0 || !input_.seek(static_cast<std::uint64_t>(byte_offset))) return false;
      index_ = record;
      header_done_ = true;
      return true;
    }

   private:
    // A file that does not divide into records: reported (and the file's rest skipped) under the
    // skip policy, else a DataError.
    bool fail(const std::string& reason) {
      if (!damage_.skip_damaged(reason)) throw DataError(reason);
      return false;
    }
    std::shared_ptr<const std::string> path_;
    ChunkedInput input_;
    const FixedLengthRecords& op_;
    DamageReport& damage_;
    std::int64_t index_ = 0;
    bool header_done_ = false;
  };

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext& ctx, DamageReport& damage) override {
    std::string path(in.at(field_).string_at(0));
    return std::make_unique<Records>(path, open_file(path, compression_, ctx.stage ? ctx.stage->storage : nullptr), *this, damage);
  }

 private:
  std::string field_;
  std::size_t record_, header_, footer_;
  Compression compression_;
  mutable PooledHostAllocator pool_;
};

}  // namespace

void register_text(Registrar& registrar) {
  registrar.add<TextLines>();
  registrar.add<FixedLengthRecords>();
}

}  // namespace sluice::io
