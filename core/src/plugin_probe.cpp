#include "plugin_probe.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

#include "sluice/core/atomic_file.hpp"
#include "sluice/core/param_parse.hpp"
#include "sluice/output_file.hpp"
#include "sluice/plugin.hpp"

namespace fs = std::filesystem;

namespace sluice {
namespace {

#if defined(__x86_64__)
constexpr unsigned kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr unsigned kHostMachine = EM_AARCH64;
#else
constexpr unsigned kHostMachine = EM_NONE;
#endif

const char* machine_name(unsigned machine) {
  switch (machine) {
    case EM_X86_64: return "x86-64";
    case EM_386: return "x86 (32-bit)";
    case EM_AARCH64: return "AArch64";
    case EM_ARM: return "ARM (32-bit)";
    case EM_RISCV: return "RISC-V";
    case EM_PPC64: return "POWER";
    case EM_S390: return "s390";
    default: return "another architecture";
  }
}

// What the child does: everything loading does in the host, so that whatever would crash, hang
// or end the host ends the child instead. Normal refusals are left for the host to explain.
[[noreturn]] void probe_in_child(const std::string& path, int report_fd, pid_t host) {
  // A Ctrl-C at the terminal reaches the whole foreground group: the probe must not die of it, or
  // a good plugin would be reported broken. The host decides what an interrupt means, and the
  // probe must not outlive a host that quits at once (second Ctrl-C), even if the plugin hangs.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != host) ::_exit(1);  // the host ended before the request above was made
  if (void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    try {
      using Entry = const PluginDescriptor* (*)();
      if (auto entry = reinterpret_cast<Entry>(::dlsym(handle, SLUICE_PLUGIN_ENTRY_SYMBOL))) {
        const PluginDescriptor* descriptor = entry();
        if (descriptor && descriptor->abi_major == kAbiMajor && descriptor->abi_minor <= kAbiMinor &&
            descriptor->register_operators) {
          CollectingRegistrar registrar;
          descriptor->register_operators(registrar);
          for (const auto& info : registrar.operators) {
            bool all_defaults = true;
            for (const auto& p : info.params) all_defaults = all_defaults && !p.required();
            if (all_defaults && info.create) info.create(parse_params(info.params, {}));
          }
        }
      }
    } catch (...) {
      // The host sees the same exception and names it.
    }
  }
  const char done = 'k';
  [[maybe_unused]] auto ignored = ::write(report_fd, &done, 1);
  ::_exit(0);
}

std::string describe_child_end(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    std::string text = fmt::format("loading it killed the probe process with signal {}{}", name ? "SIG" : "", name ? name : std::to_string(sig));
    if (sig == SIGABRT) text += " (an exception thrown by a static constructor, or abort())";
    if (sig == SIGBUS) text += " (the file is damaged or was truncated)";
    return text;
  }
  return fmt::format("loading it ended the probe process (exit status {}) before it finished: the library exits while "
                     "loading or registering",
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

std::chrono::milliseconds probe_timeout() {
  if (const char* text = std::getenv("SLUICE_PLUGIN_PROBE_TIMEOUT_MS")) {
    char* end = nullptr;
    long value = std::strtol(text, &end, 10);
    if (end != text && *end == '\0' && value > 0) return std::chrono::milliseconds(value);
  }
  return std::chrono::milliseconds(10000);
}

// What the library is, by its content: its GNU build ID (a hash the linker wrote of what it
// linked, read from the note segments without reading the whole file), or else a hash of all its
// bytes. Size and modification time alone would trust another library copied over a probed one
// with `cp -p` or `rsync -t`. Empty if the file cannot be read (then it is probed).
std::string library_identity(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return {};
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return {};
  const auto size = static_cast<std::uint64_t>(st.st_size);
  Elf64_Ehdr header{};
  if (::pread(fd, &header, sizeof header, 0) == static_cast<ssize_t>(sizeof header) && header.e_phentsize == sizeof(Elf64_Phdr)) {
    for (unsigned i = 0; i < header.e_phnum; ++i) {
      Elf64_Phdr ph{};
      if (::pread(fd, &ph, sizeof ph, static_cast<off_t>(header.e_phoff + i * sizeof ph)) != static_cast<ssize_t>(sizeof ph)) break;
      if (ph.p_type != PT_NOTE || ph.p_offset > size || ph.p_filesz > size - ph.p_offset || ph.p_filesz > (1 << 16)) continue;
      std::string notes(ph.p_filesz, '\0');
      if (::pread(fd, notes.data(), notes.size(), static_cast<off_t>(ph.p_offset)) != static_cast<ssize_t>(notes.size())) continue;
      for (std::size_t at = 0; at + sizeof(Elf64_Nhdr) <= notes.size();) {
        Elf64_Nhdr note{};
        std::memcpy(&note, notes.data() + at, sizeof note);
        const std::size_t name_at = at + sizeof note, desc_at = name_at + ((note.n_namesz + 3) & ~3u);
        const std::size_t next = desc_at + ((note.n_descsz + 3) & ~3u);
        if (next > notes.size()) break;
        if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(notes.data() + name_at, "GNU", 4) == 0 && note.n_descsz > 0) {
          std::string id = "build-id:";
          for (std::size_t k = 0; k < note.n_descsz; ++k) id += fmt::format("{:02x}", static_cast<unsigned char>(notes[desc_at + k]));
          return id;
        }
        at = next;
      }
    }
  }
  std::string bytes(size, '\0');
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    if (n <= 0) return {};
    got += static_cast<std::size_t>(n);
  }
  return fmt::format("bytes:{:016x}", std::hash<std::string_view>{}(bytes));
}

// Loads of the same library that already survived a probe: keyed by path, size, mtime and content
// identity (library_identity).
class ProbeCache {
 public:
  bool known_good(const std::string& key) {
    std::lock_guard lock(mutex_);
    load();
    return good_.count(key) != 0;
  }
  void remember(const std::string& key) {
    std::lock_guard lock(mutex_);
    load();
    if (!good_.insert(key).second || file_.empty()) return;
    std::string text;
    for (const auto& k : good_) text += k + '\n';
    try {
      std::error_code ec;
      fs::create_directories(file_.parent_path(), ec);
      write_file_atomically(file_, text);
    } catch (const std::exception&) {
      // No cache: every start probes again, which is slower but as safe.
    }
  }

 private:
  void load() {
    if (loaded_) return;
    loaded_ = true;
    file_ = location();
    if (file_.empty()) return;
    // Only a regular file is read, opened without blocking: a FIFO at the cache's path would stop
    // every start waiting for a writer. Anything else there means no cache (probes every time).
    const int fd = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return;
    struct stat st {};
    std::string text;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < kLargestCache) {
      text.resize(static_cast<std::size_t>(st.st_size));
      const ssize_t got = ::pread(fd, text.data(), text.size(), 0);
      text.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
    } else {
      file_.clear();  // and never written over
    }
    ::close(fd);
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) good_.insert(line);
  }
  static constexpr off_t kLargestCache = 16 << 20;
  static fs::path location() {
    if (const char* set = std::getenv("SLUICE_PLUGIN_PROBE_CACHE")) return std::string(set) == "off" ? fs::path() : fs::path(set);
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "sluice" / "plugin-probes.txt";
    if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "sluice" / "plugin-probes.txt";
    return {};
  }
  std::mutex mutex_;
  bool loaded_ = false;
  fs::path file_;
  std::set<std::string> good_;
};

ProbeCache& probe_cache() {
  static ProbeCache cache;
  return cache;
}

}  // namespace

std::string check_plugin_file(const fs::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) {
    if (errno == ELOOP) return "it is a loop of symbolic links";
    return fmt::format("cannot be read: {}", std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return fmt::format("it is {}, not a library file", file_kind_name(st.st_mode));
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fmt::format("cannot be read: {}", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  unsigned char ident[EI_NIDENT] = {};
  if (::pread(fd, ident, sizeof ident, 0) != static_cast<ssize_t>(sizeof ident) || std::memcmp(ident, ELFMAG, SELFMAG) != 0)
    return "not a shared library (no ELF header)";
  if (ident[EI_CLASS] != ELFCLASS64)
    return "a 32-bit ELF file; this host loads 64-bit libraries only (rebuild the plugin for this machine)";
  if (ident[EI_DATA] != ELFDATA2LSB) return "a big-endian ELF file; rebuild the plugin for this machine";
  Elf64_Ehdr header{};
  if (::pread(fd, &header, sizeof header, 0) != static_cast<ssize_t>(sizeof header)) return "a truncated ELF file (its header is cut short)";
  if (kHostMachine != EM_NONE && header.e_machine != kHostMachine)
    return fmt::format("built for {} (ELF machine {}), this host is {}; rebuild the plugin for this machine",
                       machine_name(header.e_machine), header.e_machine, machine_name(kHostMachine));
  if (header.e_type != ET_DYN) return "an ELF file that is not a shared library (build it with add_library(... MODULE))";
  // Every segment the loader will map must be inside the file: a truncated library would fault
  // (SIGBUS) inside dlopen.
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (header.e_phentsize != sizeof(Elf64_Phdr) || header.e_phoff > size ||
      static_cast<std::uint64_t>(header.e_phnum) * sizeof(Elf64_Phdr) > size - header.e_phoff)
    return "a truncated or damaged ELF file (its program headers lie outside it)";
  for (unsigned i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr ph{};
    if (::pread(fd, &ph, sizeof ph, static_cast<off_t>(header.e_phoff + i * sizeof ph)) != static_cast<ssize_t>(sizeof ph))
      return "a truncated ELF file";
    if (ph.p_type == PT_LOAD && (ph.p_offset > size || ph.p_filesz > size - ph.p_offset))
      return fmt::format("a truncated ELF file ({} bytes; a segment ends at byte {})", size, ph.p_offset + ph.p_filesz);
  }
  return {};
}

std::string probe_plugin_in_child(const fs::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return fmt::format("cannot be read: {}", std::strerror(errno));
  const std::string identity = library_identity(file);
  const std::string key = identity.empty() ? std::string()
                                           : fmt::format("{}\t{}\t{}.{:09}\t{}", file.string(), st.st_size, st.st_mtim.tv_sec,
                                                         st.st_mtim.tv_nsec, identity);
  if (!key.empty() && probe_cache().known_good(key)) return {};

  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return {};  // cannot probe: load as before
  std::fflush(nullptr);  // a library that calls exit() in the child must not write our buffers twice
  const pid_t host = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(report[0]);
    ::close(report[1]);
    return {};
  }
  if (child == 0) {
    ::close(report[0]);
    probe_in_child(file.string(), report[1], host);
  }
  ::close(report[1]);
  const auto deadline = std::chrono::steady_clock::now() + probe_timeout();
  char done = 0;
  bool reported = false, timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{report[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) timed_out = true;
    if (ready > 0) reported = ::read(report[0], &done, 1) == 1 && done == 'k';
    break;
  }
  ::close(report[0]);
  if (timed_out) ::kill(child, SIGKILL);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    return fmt::format("loading it did not finish within {} s (its initialisation or registration hangs; "
                       "SLUICE_PLUGIN_PROBE_TIMEOUT_MS sets the limit)",
                       probe_timeout().count() / 1000.0);
  if (!reported) return describe_child_end(status);
  if (!key.empty()) probe_cache().remember(key);
  return {};
}

}  // namespace sluice
