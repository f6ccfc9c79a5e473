#pragma once
// service_stream, the service's host operator on a worker: the sink of a split's run, handing each
// element to the stream that sends it to the trainer reading the split (service_stream.cpp).
#include "sluice/core/registry.hpp"

namespace sluice::service {

extern const char* const kServiceStream;  // its name

// Registers service_stream in `registry` unless it is there.
void add_service_stream(Registry& registry);

}  // namespace sluice::service
