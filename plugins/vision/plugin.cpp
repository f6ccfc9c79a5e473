#include "vision_plugin.hpp"

SLUICE_PLUGIN("vision", "0.1.0", "Images: decode (libjpeg-turbo, OpenCV), resize, augment, normalize, encode") {
  sluice::vision::register_codec_ops(registrar);
  sluice::vision::register_transform_ops(registrar);
}
