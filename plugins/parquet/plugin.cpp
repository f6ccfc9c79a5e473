#include "sluice/sdk.hpp"

namespace sluice::parquet_files {
void register_parquet(Registrar& registrar);  // parquet_reader, parquet_writer (parquet_ops.cpp)
void register_parquet_rows(Registrar& registrar);  // parquet_rows (parquet_positions.cpp)
}

SLUICE_PLUGIN("parquet", "0.1.0", "Parquet files through Arrow C++: parquet_reader, parquet_writer and parquet_rows") {
  sluice::parquet_files::register_parquet(registrar);
  sluice::parquet_files::register_parquet_rows(registrar);
}
