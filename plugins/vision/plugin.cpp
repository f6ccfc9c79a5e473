#include <opencv2/core/utility.hpp>

#include "vision_plugin.hpp"

SLUICE_PLUGIN("vision", "0.1.0", "Images: decode (libjpeg-turbo, OpenCV), resize, augment, normalize, encode") {
  // The engine runs elements in parallel; OpenCV's own thread pool inside each call would only
  // compete with it for the same cores.
  cv::setNumThreads(1);
  sluice::vision::register_codec_ops(registrar);
  sluice::vision::register_transform_ops(registrar);
}
