#pragma once
#include <cstdint>
#include <string>

namespace sluice {

// What this process may really use, as the autotuner's default budgets: not the machine's core
// count and memory, but its CPU affinity (taskset, Slurm's binding) and its cgroup's CPU quota and
// memory limit (containers, Slurm), cgroup v2 or v1.
struct UsableCores {
  double cores = 1;
  std::string why;  // "2 CPUs in this process's affinity", "cgroup quota of 1.5 CPUs"
};
UsableCores usable_cores();

// Where the cgroup files are read (tests give a made-up tree): the process's own cgroup entries
// (the v2 one is "0::PATH") and the v2 hierarchy's mount; v1 hierarchies are below the mount.
struct CgroupFiles {
  std::string own = "/proc/self/cgroup";
  std::string mount = "/sys/fs/cgroup";
};
UsableCores usable_cores(const CgroupFiles& files);

struct UsableMemory {
  std::uint64_t bytes = 0;
  std::string why;  // "the machine's 23.5 GiB", "cgroup limit of 4 GiB"
};
UsableMemory usable_memory();
UsableMemory usable_memory(const CgroupFiles& files);

// The process's peak resident memory (VmHWM) and current resident memory (VmRSS), in bytes; 0
// where /proc does not tell.
std::uint64_t peak_resident_bytes();
std::uint64_t resident_bytes();
// Starts the peak over from now (writes 5 to /proc/self/clear_refs); false where not allowed.
bool reset_peak_resident_bytes();

}  // namespace sluice
