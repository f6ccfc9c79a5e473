// service_stream: the sink a worker adds at the end of every split it runs (worker.cpp's
// split_pipeline), a QueueSink whose queue the split's stream reads.
#include "service_stream.hpp"

#include "sluice/core/element_queue.hpp"

namespace sluice::service {

const char* const kServiceStream = "service_stream";

namespace {

struct ServiceStream {
  static OperatorInfo describe() {
    OperatorInfo info;
    info.name = kServiceStream;
    info.kind = OperatorKind::Sink;
    info.summary = "Hands each element of a split to the trainer reading it (added by the service's workers)";
    info.params = {ParamSpec::make("queue", ParamType::String, "the stream's queue").def("")};
    info.create = [](const Params& p) { return std::make_unique<QueueSink>(p); };
    return info;
  }
};

}  // namespace

void add_service_stream(Registry& registry) {
  if (!registry.find(kServiceStream)) registry.add_host_operator(ServiceStream::describe(), "service");
}

}  // namespace sluice::service
