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

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string_view>

#include <fmt/format.h>

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

// Loads the library into this process and describes it: the probe's work in its child, or the
// host's own where no child can be made.
registry::Library load_and_describe(const std::string& path) {
  if (void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return describe_loaded_library(handle);
  registry::Library described;
  const char* text = ::dlerror();
  described.set_refusal(std::string("cannot be loaded: ") + (text ? text : "the dynamic loader refused it"));
  return described;
}

// A static constructor that throws ends the process in a library built by GCC (std::terminate:
// SIGABRT), but in one built by clang 14 the exception leaves dlopen() itself: the child names it
// rather than letting it reach the CLI's own handler as an unexplained exit.
registry::Library described_in_child(const std::string& path) {
  auto refused = [](const std::string& what) {
    registry::Library described;
    described.set_refusal("an exception left the library while it loaded (a static constructor threw" + what);
    return described;
  };
  try {
    return load_and_describe(path);
  } catch (const std::exception& e) {
    return refused(std::string("): ") + e.what());
  } catch (...) {
    return refused(" something not a std::exception)");
  }
}

// What the child does: everything loading does in the host, so that whatever would crash, hang
// or end the host ends the child instead; then it writes what it learnt to `report_fd`.
[[noreturn]] void probe_in_child(const std::string& path, int report_fd, pid_t host) {
  // A Ctrl-C at the terminal reaches the whole foreground group: the probe must not die of it, or
  // a good plugin would be reported broken. The host decides what an interrupt means, and the
  // probe must not outlive a host that quits at once (second Ctrl-C), even if the plugin hangs.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != host) ::_exit(1);  // the host ended before the request above was made
  const std::string bytes = described_in_child(path).SerializeAsString();
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(report_fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(1);
    done += static_cast<std::size_t>(n);
  }
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

}  // namespace

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

// `abi_minor`: the SDK the library was built for; a role is read only from 6.8 on (before, those
// bytes were padding).
void describe_operator(const OperatorInfo& info, std::uint32_t abi_minor, registry::Operator& out) {
  out.set_name(info.name);
  out.set_kind(static_cast<int>(info.kind));
  out.set_summary(info.summary);
  out.set_stateless(info.traits.stateless);
  out.set_random(info.traits.random);
  out.set_keeps_shape(info.traits.keeps_shape);
  out.set_saves_state(info.traits.saves_state);
  if (abi_minor >= 8) out.set_role(static_cast<int>(info.traits.role));
  out.set_min_inputs(info.min_inputs);
  out.set_max_inputs(info.max_inputs);
  for (const auto& p : info.params) {
    auto& param = *out.add_params();
    param.set_name(p.name);
    param.set_type(static_cast<int>(p.type));
    param.set_doc(p.doc);
    if (p.default_value) param.set_default_value(*p.default_value);
    if (p.min) param.set_min(*p.min);
    if (p.max) param.set_max(*p.max);
    for (const auto& c : p.choices) param.add_choices(c);
    param.set_hint_role(static_cast<int>(p.hint_role));
    param.set_hint(p.hint);
  }
}

OperatorInfo operator_from(const registry::Operator& described) {
  OperatorInfo info;
  info.name = described.name();
  info.kind = static_cast<OperatorKind>(described.kind());
  info.summary = described.summary();
  info.traits.stateless = described.stateless();
  info.traits.random = described.random();
  info.traits.keeps_shape = described.keeps_shape();
  info.traits.saves_state = described.saves_state();
  if (described.role() > 0 && described.role() <= kLastOperatorRole) info.traits.role = static_cast<OperatorRole>(described.role());
  info.min_inputs = described.min_inputs();
  info.max_inputs = described.max_inputs();
  for (const auto& param : described.params()) {
    ParamSpec p;
    p.name = param.name();
    p.type = static_cast<ParamType>(param.type());
    p.doc = param.doc();
    if (param.has_default_value()) p.default_value = param.default_value();
    if (param.has_min()) p.min = param.min();
    if (param.has_max()) p.max = param.max();
    p.choices.assign(param.choices().begin(), param.choices().end());
    p.hint_role = static_cast<ParamSpec::HintRole>(param.hint_role());
    p.hint = param.hint();
    info.params.push_back(std::move(p));
  }
  return info;
}

namespace {

// The checks of one operator a library registers: a refusal's words, or empty.
std::string check_operator(const OperatorInfo& info, std::set<std::string>& names_in_library) {
  if (info.name.empty()) return "registers an operator with no name";
  if (!info.create) return fmt::format("operator '{}' has no factory", info.name);
  if (info.kind == OperatorKind::Combine &&
      (info.min_inputs < 1 || (info.max_inputs != kAnyNumberOfInputs && info.max_inputs < info.min_inputs)))
    return fmt::format("combine operator '{}' takes {} to {} inputs; min_inputs must be 1 or more and max_inputs "
                       "at least min_inputs (or kAnyNumberOfInputs)",
                       info.name, info.min_inputs, info.max_inputs);
  if (!names_in_library.insert(info.name).second) return fmt::format("registers operator '{}' twice", info.name);
  // Build one with default parameters where every parameter has one: a plugin whose operators
  // cannot even be constructed is refused now, not in the middle of someone's run.
  const bool all_defaults = std::all_of(info.params.begin(), info.params.end(), [](const auto& p) { return !p.required(); });
  if (!all_defaults) return {};
  try {
    if (!info.create(parse_params(info.params, {}))) return fmt::format("operator '{}' factory returned nothing", info.name);
  } catch (const std::exception& e) {
    return fmt::format("operator '{}' failed to construct with default parameters: {}", info.name, e.what());
  } catch (...) {
    return fmt::format("operator '{}' failed to construct with default parameters", info.name);
  }
  return {};
}

}  // namespace

registry::Library describe_loaded_library(void* handle) {
  registry::Library out;
  // Every refusal below depends on the library's bytes alone (and this host's ABI).
  auto refuse = [&](std::string reason) {
    out.Clear();
    out.set_refusal(std::move(reason));
    out.set_refusal_depends_on_file_only(true);
    return out;
  };
  using Entry = const PluginDescriptor* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, SLUICE_PLUGIN_ENTRY_SYMBOL));
  if (!entry) return refuse("has no entry symbol '" SLUICE_PLUGIN_ENTRY_SYMBOL "' (was it declared with SLUICE_PLUGIN?)");
  const PluginDescriptor* descriptor = nullptr;
  try {
    descriptor = entry();
  } catch (const std::exception& e) {
    return refuse(fmt::format("its entry function threw: {}", e.what()));
  }
  if (!descriptor) return refuse("its entry function returned no descriptor");
  if (descriptor->abi_major != kAbiMajor)
    return refuse(fmt::format("built for plugin ABI {}.{}, this host has ABI {}.{} (major versions differ: rebuild the "
                              "plugin against this SDK)",
                              descriptor->abi_major, descriptor->abi_minor, kAbiMajor, kAbiMinor));
  if (descriptor->abi_minor > kAbiMinor)
    return refuse(fmt::format("built for plugin ABI {}.{}, newer than this host's {}.{} (upgrade Sluice or rebuild the "
                              "plugin against this SDK)",
                              descriptor->abi_major, descriptor->abi_minor, kAbiMajor, kAbiMinor));
  const std::string plugin_name = descriptor->name ? descriptor->name : "";
  if (plugin_name.empty()) return refuse("its descriptor has no plugin name");
  if (!descriptor->register_operators) return refuse("its descriptor has no registration function");

  CollectingRegistrar registrar;
  try {
    descriptor->register_operators(registrar);
  } catch (const std::exception& e) {
    return refuse(fmt::format("registering its operators threw: {}", e.what()));
  } catch (...) {
    return refuse("registering its operators threw a non-standard exception");
  }
  std::set<std::string> names_in_library;
  for (const auto& info : registrar.operators) {
    if (auto problem = check_operator(info, names_in_library); !problem.empty()) return refuse(problem);
    describe_operator(info, descriptor->abi_minor, *out.add_operators());
  }
  out.set_plugin_name(plugin_name);
  out.set_version(descriptor->version ? descriptor->version : "");
  out.set_summary(descriptor->summary ? descriptor->summary : "");
  out.set_abi_minor(descriptor->abi_minor);
  return out;
}

registry::Library probe_library(const fs::path& file) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return load_and_describe(file.string());  // cannot probe: load as before
  std::fflush(nullptr);  // a library that calls exit() in the child must not write our buffers twice
  const pid_t host = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(report[0]);
    ::close(report[1]);
    return load_and_describe(file.string());
  }
  if (child == 0) {
    ::close(report[0]);
    probe_in_child(file.string(), report[1], host);
  }
  ::close(report[1]);
  const auto deadline = std::chrono::steady_clock::now() + probe_timeout();
  std::string reported;
  bool ended = false, timed_out = false;
  while (!ended) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{report[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      timed_out = ready == 0;
      break;
    }
    char buffer[16384];
    const ssize_t n = ::read(report[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ended = true;  // the child closed its end: it exited, or died
    else reported.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(report[0]);
  if (timed_out) ::kill(child, SIGKILL);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  registry::Library described;
  if (timed_out) {
    described.set_refusal(fmt::format("loading it did not finish within {} s (its initialisation or registration hangs; "
                                      "SLUICE_PLUGIN_PROBE_TIMEOUT_MS sets the limit)",
                                      probe_timeout().count() / 1000.0));
  } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) || !described.ParseFromString(reported) ||
             (described.refusal().empty() && described.plugin_name().empty())) {
    // (A library that calls exit(0) while loading ends the child with status 0 and no report.)
    described.Clear();
    described.set_refusal(describe_child_end(status));
  }
  return described;
}

}  // namespace sluice
