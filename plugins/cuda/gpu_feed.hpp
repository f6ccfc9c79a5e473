#pragma once
#include "sluice/sdk.hpp"

namespace sluice::cuda {
void register_gpu_feed(Registrar& registrar);
}
