// The service's part of `sluice` (cli.hpp): the command is built without the service, whose gRPC
// and the 45 libraries it brings cost 14 ms of every start (bench/README.md, startup.sh). A
// command that needs the service continues in libexec/sluice-service, the same command built with
// it: this process becomes that one (exec), with the same arguments, pid, descriptors and signal
// mask, before it has done anything the other would do again.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <boost/dll/runtime_symbol_info.hpp>
#include <fmt/format.h>

#include "cli.hpp"
#include "sluice/core/text.hpp"
#include "sluice/operator.hpp"

namespace sluice_cli {
namespace {

std::vector<std::string>& command_line() {
  static std::vector<std::string> arguments;
  return arguments;
}

// libexec/sluice-service beside bin/ (the build tree mirrors an install).
std::filesystem::path service_command() {
  std::error_code ec;
  const std::filesystem::path self = boost::dll::program_location(ec);
  if (ec || self.empty()) return "libexec/sluice-service";
  return (self.parent_path() / ".." / "libexec" / "sluice-service").lexically_normal();
}

[[noreturn]] void continue_with_the_service(const std::string& what) {
  const auto command = service_command();
  if (std::getenv(kHandedOver)) {
    fmt::print(stderr, "error: {} needs the Sluice service, and {} was not built with it; reinstall Sluice\n", what,
               sluice::printable(command.string()));
    std::exit(kExitRunFailed);
  }
  std::vector<char*> argv;
  for (auto& argument : command_line()) argv.push_back(argument.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);  // what this process printed comes before what the other prints
  ::setenv(kHandedOver, "1", 1);
  ::execv(command.c_str(), argv.data());
  const int error = errno;
  fmt::print(stderr, "error: {} needs the Sluice service, which runs in {}: it could not be started ({}); reinstall Sluice\n",
             what, sluice::printable(command.string()), std::strerror(error));
  std::exit(kExitRunFailed);
}

}  // namespace

void remember_command_line(int argc, char** argv) { command_line().assign(argv, argv + argc); }

void add_service_operators(sluice::Registry& registry) {
  auto info = sluice::service::service_source_info();
  if (registry.find(info.name)) return;
  // Listed and checked as the service's own; a run that names it is handed over when its pipeline
  // is prepared (split_at_service). Only a command that prepares none (`sluice bench`) gets here.
  info.create = [name = info.name](const sluice::Params&) -> std::unique_ptr<sluice::Operator> {
    continue_with_the_service(fmt::format("a {} stage", name));
  };
  registry.add_host_operator(std::move(info), "service");
}

void split_at_service(const sluice::Registry& registry, sluice::PipelineDocument& doc) {
  for (const auto& stage : doc.spec.stage())
    if (stage.has_distribute() || registry.has_role(stage.op(), sluice::OperatorRole::ReadsService))
      continue_with_the_service(fmt::format("{}'s stage '{}'", sluice::printable(doc.file), sluice::printable(stage.id())));
}

int cmd_dispatcher(const DispatcherRequest&) { continue_with_the_service("`sluice dispatcher`"); }

int cmd_worker(const CommonOptions&, WorkerRequest) { continue_with_the_service("`sluice worker`"); }

int cmd_service_workers(const std::string&, const sluice::service::Security&) {
  continue_with_the_service("`sluice service workers`");
}

}  // namespace sluice_cli
