#pragma once
// Wall and CPU time for the benchmarks, which compare against baselines measured in the same run.
#include <sys/resource.h>

#include <chrono>

namespace sluice::bench {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// CPU seconds (user and system, every thread) this process has used: a pipeline whose stages run
// at once uses several cores even with one worker per stage, so speed alone hides its cost.
inline double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace sluice::bench
