#pragma once
#include "sluice/sdk.hpp"

namespace sluice::vision {

void register_codec_ops(Registrar& registrar);      // decode_image, encode_image, synthetic_images
void register_transform_ops(Registrar& registrar);  // resize, random_resized_crop, random_flip, ...

}  // namespace sluice::vision
