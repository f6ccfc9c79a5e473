#include "sluice/sdk.hpp"

namespace sluice::parquet_files {
void register_parquet(Registrar& registrar);  // parquet_reader, parquet_writer (parquet_ops.cpp)
}

SLUICE_PLUGIN("parquet", "0.1.0", "Parquet files through Arrow C++: parquet_reader and parquet_writer") {
  sluice::parquet_files::register_parquet(registrar);
}
