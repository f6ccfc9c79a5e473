// The cost of graph stages per element, against a chain of the same length measured in the same
// run: a mixing stage (sample_from_datasets, concatenate, zip) reading two sources, and a tee
// handing every element to two and three readers, next to source -> identity -> sink with a
// thread and a buffer per stage (fusion off, so that the chain pays every hand-off too).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sluice/core/engine.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::string range(const std::string& id, long long count) {
  return fmt::format("stage {{ id: \"{}\" op: \"range\" params {{ key: \"count\" value: \"{}\" }} }}\n", id, count);
}
std::string stage(const std::string& id, const std::string& op, const std::vector<std::string>& inputs, const std::string& params = "") {
  std::string text = fmt::format("stage {{ id: \"{}\" op: \"{}\"", id, op);
  for (const auto& in : inputs) text += fmt::format(" input: \"{}\"", in);
  return text + " " + params + " }\n";
}

struct Case {
  std::string name;
  std::string text;
  long long elements;  // what the rate counts: elements out of the source(s) or into the mixing stage's sink
};

std::vector<Case> cases(long long n) {
  const std::string options = "options { fuse_stages: false }\n";
  return {
      {"chain: source -> identity -> sink", options + range("src", n) + stage("pass", "identity", {"src"}) + stage("out", "null_sink", {"pass"}), n},
      {"sample_from_datasets of 2 sources", options + range("a", n / 2) + range("b", n / 2) + stage("mix", "sample_from_datasets", {"a", "b"}) +
                                                stage("out", "null_sink", {"mix"}), n / 2 * 2},
      {"concatenate of 2 sources", options + range("a", n / 2) + range("b", n / 2) + stage("cat", "concatenate", {"a", "b"}) +
                                       stage("out", "null_sink", {"cat"}), n / 2 * 2},
      {"zip of 2 sources (per pair)", options + range("a", n / 2) + range("b", n / 2) +
                                          stage("z", "zip", {"a", "b"}, "params { key: \"prefixes\" value: \"a,b\" }") +
                                          stage("out", "null_sink", {"z"}), n / 2},
      {"tee to 2 sinks (per source element)", options + range("src", n) + stage("one", "null_sink", {"src"}) + stage("two", "null_sink", {"src"}), n},
      {"tee to 3 sinks (per source element)", options + range("src", n) + stage("one", "null_sink", {"src"}) + stage("two", "null_sink", {"src"}) +
                                                  stage("three", "null_sink", {"src"}), n},
  };
}

double seconds(const sluice::Registry& registry, const std::string& text) {
  sluice::Engine engine(sluice::build_graph(sluice::parse_pipeline(text, "bench"), registry));
  const auto t0 = Clock::now();
  engine.start();
  const auto result = engine.wait();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (result.state != sluice::RunState::Finished) throw sluice::Error("bench pipeline failed: " + result.error);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const long long n = argc > 1 ? std::atoll(argv[1]) : 2'000'000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  sluice::Registry registry;
  registry.load_search_path();
  auto all = cases(n);
  std::vector<double> best(all.size(), 1e300);
  // Rounds alternate the cases, so that a busy moment of a shared machine hits them alike.
  for (int round = 0; round < rounds; ++round)
    for (std::size_t i = 0; i < all.size(); ++i) best[i] = std::min(best[i], seconds(registry, all[i].text));
  const double chain_ns = best[0] * 1e9 / static_cast<double>(all[0].elements);
  std::printf("%-40s %14s %12s %14s\n", "pipeline", "elements/s", "ns/element", "vs chain");
  for (std::size_t i = 0; i < all.size(); ++i) {
    const double ns = best[i] * 1e9 / static_cast<double>(all[i].elements);
    std::printf("%-40s %14.0f %12.1f %13.2fx\n", all[i].name.c_str(), all[i].elements / best[i], ns, ns / chain_ns);
  }
  std::printf("(%lld elements per run, best of %d; fusion off everywhere)\n", n, rounds);
  return 0;
}
