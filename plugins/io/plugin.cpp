#include "io_plugin.hpp"

SLUICE_PLUGIN("io", "0.1.0", "Files, TFRecord and tf.Example, CSV, text lines, fixed-length records, tensorflow_datasets directories and WebDataset shards") {
  sluice::io::register_files(registrar);
  sluice::io::register_tfrecord(registrar);
  sluice::io::register_csv(registrar);
  sluice::io::register_text(registrar);
  sluice::io::register_tfds(registrar);
  sluice::io::register_webdataset(registrar);
  sluice::io::register_random_access(registrar);
}
