#include "sluice/core/resources.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "sluice/core/text.hpp"

namespace sluice {
namespace {

// This process's cgroup paths: "" -> the v2 path, "cpu" / "memory" -> the v1 hierarchy's path.
struct CgroupPaths {
  std::string unified, cpu_v1, memory_v1;
};

CgroupPaths own_cgroups(const std::string& own) {
  CgroupPaths paths;
  std::ifstream in(own);
  for (std::string line; std::getline(in, line);) {
    // "ID:CONTROLLERS:PATH"
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
    const std::string path = line.substr(second + 1);
    if (controllers == ",,") paths.unified = path;
    if (controllers.find(",cpu,") != std::string::npos) paths.cpu_v1 = path;
    if (controllers.find(",memory,") != std::string::npos) paths.memory_v1 = path;
  }
  return paths;
}

bool read_first_line(const std::string& file, std::string& line) {
  std::ifstream in(file);
  return in && std::getline(in, line);
}

// The folders to look in for a controller's files: the process's own cgroup and its parents up
// to the mount's root (a container often sees only the root of its namespace).
std::vector<std::string> cgroup_folders(const std::string& mount, const std::string& path) {
  std::vector<std::string> folders;
  std::string p = path;
  while (!p.empty() && p != "/") {
    folders.push_back(mount + p);
    p = p.substr(0, p.rfind('/'));
  }
  folders.push_back(mount);
  return folders;
}

// The tightest CPU quota (cores) along the process's cgroup path, or 0 when none.
double cgroup_cpu_quota(const CgroupPaths& paths, const std::string& mount_root) {
  double tightest = 0;
  auto consider = [&](double cores) {
    if (cores > 0 && (tightest == 0 || cores < tightest)) tightest = cores;
  };
  for (const auto& folder : cgroup_folders(mount_root, paths.unified)) {
    std::string line;
    if (!read_first_line(folder + "/cpu.max", line)) continue;
    std::istringstream fields(line);  // "max 100000" or "150000 100000"
    std::string quota;
    double period = 0;
    if (fields >> quota >> period && quota != "max" && period > 0) consider(std::stod(quota) / period);
  }
  for (const std::string& mount : {mount_root + "/cpu,cpuacct", mount_root + "/cpu"}) {
    for (const auto& folder : cgroup_folders(mount, paths.cpu_v1)) {
      std::string quota, period;
      if (!read_first_line(folder + "/cpu.cfs_quota_us", quota) || !read_first_line(folder + "/cpu.cfs_period_us", period)) continue;
      const double q = std::stod(quota), p = std::stod(period);
      if (q > 0 && p > 0) consider(q / p);
    }
  }
  return tightest;
}

// The tightest memory limit along the process's cgroup path, or 0 when none.
std::uint64_t cgroup_memory_limit(const CgroupPaths& paths, const std::string& mount_root) {
  std::uint64_t tightest = 0;
  auto consider = [&](const std::string& text) {
    if (text.empty() || text == "max") return;
    const auto bytes = std::stoull(text);
    // v1 writes "no limit" as a huge number rounded to the page size.
    if (bytes == 0 || bytes >= (std::uint64_t{1} << 60)) return;
    if (tightest == 0 || bytes < tightest) tightest = bytes;
  };
  for (const auto& folder : cgroup_folders(mount_root, paths.unified)) {
    std::string line;
    if (read_first_line(folder + "/memory.max", line)) consider(line);
  }
  for (const auto& folder : cgroup_folders(mount_root + "/memory", paths.memory_v1)) {
    std::string line;
    if (read_first_line(folder + "/memory.limit_in_bytes", line)) consider(line);
  }
  return tightest;
}

std::uint64_t proc_status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  const std::string prefix = std::string(field) + ":";
  for (std::string line; std::getline(in, line);)
    if (line.compare(0, prefix.size(), prefix) == 0) return std::stoull(line.substr(prefix.size()));
  return 0;
}

}  // namespace

UsableCores usable_cores() { return usable_cores(CgroupFiles{}); }

UsableCores usable_cores(const CgroupFiles& files) {
  UsableCores usable;
  cpu_set_t set;
  CPU_ZERO(&set);
  int affinity = 0;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) affinity = CPU_COUNT(&set);
  if (affinity <= 0) affinity = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  usable.cores = affinity;
  usable.why = fmt::format("{} CPU{} in this process's affinity", affinity, affinity == 1 ? "" : "s");
  try {
    const double quota = cgroup_cpu_quota(own_cgroups(files.own), files.mount);
    if (quota > 0 && quota < usable.cores) {
      usable.cores = quota;
      usable.why = fmt::format("its cgroup's CPU quota of {:.3g} CPUs", quota);
    }
  } catch (const std::exception&) {
    // An unreadable or odd cgroup file: the affinity stands.
  }
  return usable;
}

UsableMemory usable_memory() { return usable_memory(CgroupFiles{}); }

UsableMemory usable_memory(const CgroupFiles& files) {
  UsableMemory usable;
  const std::uint64_t machine = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  usable.bytes = machine;
  usable.why = "the machine's " + byte_size_text(machine);
  try {
    const std::uint64_t limit = cgroup_memory_limit(own_cgroups(files.own), files.mount);
    if (limit > 0 && limit < usable.bytes) {
      usable.bytes = limit;
      usable.why = "its cgroup's limit of " + byte_size_text(limit);
    }
  } catch (const std::exception&) {
  }
  return usable;
}

std::uint64_t peak_resident_bytes() { return proc_status_kib("VmHWM") * 1024; }
std::uint64_t resident_bytes() { return proc_status_kib("VmRSS") * 1024; }

bool reset_peak_resident_bytes() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace sluice
