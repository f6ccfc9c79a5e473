#pragma once
/// Everything a plugin author needs.
#include "sluice/abi.hpp"
#include "sluice/buffer.hpp"
#include "sluice/chunk.hpp"
#include "sluice/error.hpp"
#include "sluice/feed.hpp"
#include "sluice/operator.hpp"
#include "sluice/output_file.hpp"
#include "sluice/params.hpp"
#include "sluice/plugin.hpp"
#include "sluice/rng.hpp"
#include "sluice/sample.hpp"
#include "sluice/tensor.hpp"
