// service_source's description, apart from the source (service_source.cpp) so that what lists and
// checks operators links it without gRPC: the `sluice` command registers it with a factory that
// continues in the command built with the service (app/cli/service_handoff.cpp).
#include "sluice/operator.hpp"
#include "sluice/service/service.hpp"

namespace sluice::service {

OperatorInfo service_source_info() {
  OperatorInfo info;
  info.name = "service_source";
  info.kind = OperatorKind::Source;
  info.summary = "Reads a job's elements from the Sluice service's workers (put in place of the stages a `distribute` sends there)";
  info.params = {ParamSpec::make("service", ParamType::String, "the dispatcher, grpc://host:port"),
                 ParamSpec::make("job_name", ParamType::String, "the job trainers share"),
                 ParamSpec::make("pipeline", ParamType::String, "the stages the workers run, as a pipeline file's text"),
                 ParamSpec::make("processing_mode", ParamType::Choice, "how the workers share the job: DYNAMIC, OFF, FILE, DATA or FILE_OR_DATA")
                     .def("DYNAMIC")
                     .one_of({"DYNAMIC", "OFF", "FILE", "DATA", "FILE_OR_DATA"}),
                 ParamSpec::make("pipeline_file", ParamType::String, "the file the stages came from: their relative paths are of its folder")
                     .def(""),
                 ParamSpec::make("split_size", ParamType::Int, "source elements per split").def("1").range(1, std::nullopt),
                 ParamSpec::make("splits_in_flight", ParamType::Int, "splits read at once (each from the worker making it)").def("4").range(1, 256),
                 ParamSpec::make("compression", ParamType::Choice, "of the elements the workers send: NONE, ZSTD or SNAPPY").def("NONE").one_of({"NONE", "ZSTD", "SNAPPY"}),
                 ParamSpec::make("token_file", ParamType::String, "the service's token file").def(""),
                 ParamSpec::make("tls_ca", ParamType::String, "the authority to trust for TLS").def(""),
                 // Which of the job's trainers this is (from the launcher, as a shard's index and count).
                 ParamSpec::make("trainer_index", ParamType::Int, "this trainer among those reading the job").def("-1").takes_hint("worker_index"),
                 ParamSpec::make("num_trainers", ParamType::Int, "the trainers reading the job").def("-1").takes_hint("num_workers"),
                 // Coordinated reads (tf.data's): every one of the job's num_consumers trainers gets one element of each round.
                 ParamSpec::make("num_consumers", ParamType::Int, "the trainers reading the job in coordinated rounds (0: first come, first served)")
                     .def("0")
                     .range(0, 4096),
                 ParamSpec::make("consumer_index", ParamType::Int, "this trainer among the job's consumers").def("-1")};
  info.traits.role = OperatorRole::ReadsService;
  return info;
}

}  // namespace sluice::service
