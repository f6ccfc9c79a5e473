// libFuzzer target: Parquet files through Arrow's reader and Sluice's conversion of its arrays
// (every column type, nulls refused and filled, reads begun inside the file, read in place or
// decoded ahead on threads of the file as parquet_reader reads: whole row groups, or a record
// batch ahead where the metadata's sizes are past decode_ahead_bytes). Arrow itself is not
// instrumented here (the peers' pyarrow build); a crash in it still stops the run.
#include <cstdint>

#include "parquet_format.hpp"
#include "sluice/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sluice::parquet_files;
  if (size < 1) return 0;
  ReadOptions options;
  options.nulls.fill = data[0] & 1;
  options.use_threads = false;
  options.batch_rows = 1 + (data[0] >> 1);
  options.decode_ahead = size % 3 != 0;
  options.ahead_bytes = size % 3 == 1 ? std::int64_t{1} << 28 : 64;
  try {
    ParquetFileReader reader("fuzz.parquet", arrow_file_in_memory("fuzz.parquet", data + 1, size - 1), options);
    for (std::int64_t from : {std::int64_t{0}, reader.rows() / 2}) {
      reader.start_at(from);
      sluice::Chunk chunk;
      for (int chunks = 0; chunks < 1000; ++chunks) {
        try {
          if (!reader.next_chunk(chunk, 7)) break;
          for (std::size_t r = 0; r < chunk.rows(); ++r) (void)chunk.row(r).nbytes();  // every row's tensors in bounds
        } catch (const sluice::DataError&) {
          reader.skip_group();
        }
      }
    }
  } catch (const sluice::Error&) {
  }
  return 0;
}
