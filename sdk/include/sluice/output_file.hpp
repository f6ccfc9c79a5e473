#pragma once
/// Output files that never destroy what is at their path and never look complete when they are
/// not: bytes go to a temporary file created exclusively beside the target (TARGET.partial-XXXXXX,
/// unique per writer, so two writers never share one), and the temporary is renamed over the
/// target only when the output is complete. A target that exists and is not a regular file (a
/// directory, FIFO, socket or block device) is refused; a character device such as /dev/null is
/// written through; a symbolic link is followed, so the file it points to is replaced and the link
/// stays. A remote target (s3://, gs://) is spooled to a local temporary file the same way and
/// uploaded when complete (StageInfo::storage): the object appears whole or not at all.
/// Header-only, for plugins and the host alike.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/error.hpp"
#include "sluice/rng.hpp"
#include "sluice/state.hpp"
#include "sluice/storage.hpp"

namespace sluice {

/// What a stat mode is, in words a user understands.
inline const char* file_kind_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

struct OutputTarget {
  std::string path;            ///< where the output ends up (a symlink resolved to what it names)
  bool write_through = false;  ///< a character device: written directly, nothing to rename
};

/// Where remote outputs are written before their upload: $SLUICE_SPOOL_DIR, else $TMPDIR, else
/// /tmp, then sluice-uploads/. Created when missing.
inline std::string remote_spool_folder() {
  const char* given = std::getenv("SLUICE_SPOOL_DIR");
  if (!given || !*given) given = std::getenv("TMPDIR");
  std::string folder = std::string(given && *given ? given : "/tmp") + "/sluice-uploads";
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  return folder;
}

/// The prefix of the partial files of `target`: TARGET.partial- beside a local target; for a
/// remote one, SPOOL/upload-HASH.partial-, HASH naming the URI (so a resumed run finds its file).
inline std::string partial_prefix_of(const std::string& target) {
  if (!is_remote_uri(target)) return target + ".partial-";
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(stable_hash(target)));
  return remote_spool_folder() + "/upload-" + hex + ".partial-";
}

/// Decides where output for `path` goes, or throws an Error that says why it cannot.
inline OutputTarget resolve_output_target(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) throw Error("the output path is empty");
  if (is_remote_uri(path)) {
    if (path.rfind("s3://", 0) != 0 && path.rfind("gs://", 0) != 0)
      throw Error("output " + path + ": http(s) URLs are read-only; write to an s3:// or gs:// URI or a local path");
    return {path, false};
  }
  OutputTarget target{path, false};
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    std::error_code ec;
    auto resolved = fs::weakly_canonical(path, ec);  // follows every link of the chain
    if (ec) throw Error("output " + path + " is a symbolic link that cannot be followed: " + ec.message());
    target.path = resolved.string();
  }
  if (::stat(target.path.c_str(), &st) == 0) {
    if (S_ISCHR(st.st_mode)) {
      target.write_through = true;
    } else if (!S_ISREG(st.st_mode)) {
      throw Error("output " + path + " exists and is " + file_kind_name(st.st_mode) +
                  ": Sluice only replaces regular files; choose a file path");
    }
  } else if (errno == ELOOP) {
    throw Error("output " + path + " is a loop of symbolic links; choose a file path");
  }
  return target;
}

inline std::string absolute_path(const std::string& path) {
  if (is_remote_uri(path)) return path;
  return std::filesystem::absolute(path).lexically_normal().string();
}

/// Where an output stood at a checkpoint: what a resumed run needs to go on with it.
struct SavedOutput {
  std::string target;        ///< absolute: the name the output is published under
  std::string partial;       ///< absolute: the .partial file (or folder) it was written under; empty: none
  std::uint64_t length = 0;  ///< its bytes on disk at the checkpoint
  std::uint64_t device = 0, inode = 0;  ///< its identity, which a rename keeps

  /// The partial file or folder `partial` of `target` as it is on disk now: its size and identity.
  static SavedOutput of(const std::string& target, const std::string& partial) {
    SavedOutput saved;
    saved.target = absolute_path(target);
    saved.partial = absolute_path(partial);
    struct stat st {};
    if (::stat(partial.c_str(), &st) != 0) throw Error("cannot read " + partial + ": " + std::strerror(errno));
    saved.length = static_cast<std::uint64_t>(st.st_size);
    saved.device = static_cast<std::uint64_t>(st.st_dev);
    saved.inode = static_cast<std::uint64_t>(st.st_ino);
    return saved;
  }
  /// Throws unless `partial` is a partial name of `target` (TARGET.partial-XXXXXX), so that a
  /// checkpoint of something else never makes a resumed run write elsewhere.
  void check_partial_of_target() const {
    const std::string own_prefix = partial_prefix_of(target);
    if (partial.compare(0, own_prefix.size(), own_prefix) != 0 || partial.find('/', own_prefix.size()) != std::string::npos)
      throw Error("the checkpoint's output " + partial + " is not a partial output of " + target);
  }

  void save(StateWriter& w) const {
    w.put_string(target);
    w.put_string(partial);
    w.put(length);
    w.put(device);
    w.put(inode);
  }
  static SavedOutput load(StateReader& r) {
    SavedOutput saved;
    saved.target = r.get_string();
    saved.partial = r.get_string();
    saved.length = r.get<std::uint64_t>();
    saved.device = r.get<std::uint64_t>();
    saved.inode = r.get<std::uint64_t>();
    return saved;
  }
};

/// For a resumed run: makes `saved.partial` hold the earlier run's output again. It is there when
/// that run was cut off (killed, or interrupted after the checkpoint). A run that stopped at the
/// checkpoint, or went on and finished, published it under one of the names in `published`: found
/// there by its identity, it is renamed back, so nothing is copied and a second resume from the
/// same checkpoint finds it again. Throws an Error naming the files when it is nowhere.
/// A remote target published at the checkpoint's stop is read back from the store (`storage`)
/// into its spool file: its first `saved.length` bytes, whole or not at all.
inline void reclaim_partial(const SavedOutput& saved, const std::vector<std::string>& published, Storage* storage = nullptr) {
  struct stat st {};
  if (saved.partial.empty() || ::lstat(saved.partial.c_str(), &st) == 0) return;
  if (is_remote_uri(saved.target)) {
    if (!storage) throw Error("cannot take back " + saved.target + ": remote outputs are written through a Sluice engine");
    auto reader = storage->open(saved.target);
    if (reader->object().size < saved.length)
      throw Error(saved.target + " holds " + std::to_string(reader->object().size) + " bytes, fewer than the " + std::to_string(saved.length) +
                  " written before the checkpoint (replaced since?); resume from a later checkpoint, or run again");
    std::string taking = saved.partial + ".download-XXXXXX";
    const int fd = ::mkostemp(taking.data(), O_CLOEXEC);
    if (fd < 0) throw Error("cannot write " + taking + ": " + std::strerror(errno));
    std::vector<std::byte> buffer(1 << 20);
    for (std::uint64_t copied = 0; copied < saved.length;) {
      const std::size_t n = reader->read(buffer.data(), static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), saved.length - copied)));
      if (n == 0 || ::write(fd, buffer.data(), n) != static_cast<ssize_t>(n)) {
        ::close(fd);
        ::unlink(taking.c_str());
        throw Error("cannot take back " + saved.target + " into " + saved.partial + (n == 0 ? ": it ended early" : std::string(": ") + std::strerror(errno)));
      }
      copied += n;
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(taking.c_str(), saved.partial.c_str()) != 0) {
      ::unlink(taking.c_str());
      throw Error("cannot take back " + saved.target + " into " + saved.partial + ": " + std::strerror(errno));
    }
    return;
  }
  for (const auto& name : published) {
    if (::lstat(name.c_str(), &st) != 0 || static_cast<std::uint64_t>(st.st_dev) != saved.device ||
        static_cast<std::uint64_t>(st.st_ino) != saved.inode)
      continue;
    if (::rename(name.c_str(), saved.partial.c_str()) != 0)
      throw Error("cannot take " + name + " back to continue it as " + saved.partial + ": " + std::strerror(errno));
    return;
  }
  throw Error("the output written before the checkpoint is gone: neither " + saved.partial + " nor " +
              (published.empty() ? std::string("its published name") : published.front() + (published.size() > 1 ? " or the others" : "")) +
              " is the file that run wrote (moved, replaced or removed since?); resume from a later checkpoint, or run again");
}

/// One output file written atomically. Not thread-safe; one writer per object.
class AtomicOutputFile {
 public:
  AtomicOutputFile() = default;
  explicit AtomicOutputFile(const std::string& path, Storage* storage = nullptr) { open(path, storage); }
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;
  ~AtomicOutputFile() { close_stream(); }  // not committed: the .partial file stays, visibly incomplete

  /// `storage` (StageInfo::storage) publishes a remote target; without it one is refused.
  void open(const std::string& path, Storage* storage = nullptr) {
    close_stream();
    requested_ = path;
    target_ = resolve_output_target(path);
    storage_ = storage;
    if (is_remote_uri(path) && !storage_)
      throw Error("cannot write " + path + ": remote outputs are written through a Sluice engine (this writer was given no storage)");
    int fd = -1;
    if (is_remote_uri(path)) {
      temporary_ = partial_prefix_of(path) + "XXXXXX";
      fd = ::mkostemp(temporary_.data(), O_CLOEXEC);
    } else if (target_.write_through) {
      temporary_.clear();
      fd = ::open(target_.path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
      if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    } else {
      temporary_ = target_.path + ".partial-XXXXXX";
      fd = ::mkostemp(temporary_.data(), O_CLOEXEC);  // O_EXCL: a name no other writer holds
      if (fd >= 0) ::fchmod(fd, 0666 & ~current_umask());
    }
    if (fd < 0) {
      const int err = errno;
      throw Error("cannot write " + (temporary_.empty() ? target_.path : temporary_) + ": " + std::strerror(err) +
                  (err == ENOENT ? " (does the folder exist?)" : ""));
    }
    stream_ = ::fdopen(fd, "wb");
    if (!stream_) {
      ::close(fd);
      throw Error("cannot write " + temporary_ + ": " + std::strerror(errno));
    }
  }

  bool is_open() const { return stream_ != nullptr; }
  std::FILE* stream() const { return stream_; }
  /// The file being written: the temporary, or the device written through.
  const std::string& writing_path() const { return temporary_.empty() ? target_.path : temporary_; }
  const std::string& target_path() const { return target_.path; }

  void write(const void* data, std::size_t n) {
    if (n && std::fwrite(data, 1, n, stream_) != n) throw Error("writing " + writing_path() + " failed: " + std::strerror(errno));
  }
  void write(std::string_view text) { write(text.data(), text.size()); }

  /// Flushes to disk and renames the temporary over the target. Throws, and leaves no target
  /// that looks complete, when any byte failed to reach the disk.
  void commit() {
    if (!stream_) return;
    finish_writing();
    if (!target_.write_through) publish_as(requested_);
  }
  /// The two halves of commit(), for outputs whose final name is known only at the end (shards
  /// named -of-N): flush to disk and close; then rename the temporary to `path`.
  void finish_writing() {
    if (!stream_) return;
    const bool ok = std::fflush(stream_) == 0 && !std::ferror(stream_) && (target_.write_through || ::fsync(::fileno(stream_)) == 0);
    const int err = errno;
    std::fclose(stream_);
    stream_ = nullptr;
    if (!ok) throw Error("writing " + writing_path() + " failed: " + std::strerror(err));
  }
  void publish_as(const std::string& path) {
    const OutputTarget final_target = resolve_output_target(path);  // refuses a non-file that appeared meanwhile
    if (is_remote_uri(path)) {
      if (!storage_) throw Error("cannot publish " + path + ": remote outputs are written through a Sluice engine");
      try {
        storage_->upload(temporary_, path);
      } catch (const std::exception& e) {
        throw Error(std::string(e.what()) + " (the output is kept in " + temporary_ + ")");
      }
      ::unlink(temporary_.c_str());
      temporary_.clear();
      target_ = final_target;
      return;
    }
    if (final_target.write_through) throw Error("output " + path + " is a device; a finished file cannot be renamed onto it");
    if (::rename(temporary_.c_str(), final_target.path.c_str()) != 0)
      throw Error("cannot rename " + temporary_ + " to " + final_target.path + ": " + std::strerror(errno));
    temporary_.clear();
    target_ = final_target;
  }
  /// For a checkpoint: every byte written so far reaches the disk; where the output stands (its
  /// target, its partial file, their length and identity), for a resumed run's continue_from().
  SavedOutput checkpoint_state() {
    if (target_.write_through) {  // a device keeps nothing to continue
      SavedOutput saved;
      saved.target = absolute_path(target_.path);
      return saved;
    }
    if (stream_ && (std::fflush(stream_) != 0 || ::fdatasync(::fileno(stream_)) != 0))
      throw Error("writing " + writing_path() + " failed: " + std::strerror(errno));
    return SavedOutput::of(target_.path, temporary_);
  }
  /// For a resumed run: goes on writing the earlier run's partial file of this same target after
  /// the `saved.length` bytes it held at the checkpoint; bytes written after them are dropped.
  /// The temporary opened for this run goes. (reclaim_partial() first, if it may be published.)
  void continue_from(const SavedOutput& saved) {
    if (target_.write_through || saved.partial.empty()) return;
    const std::string temporary = checked_partial(saved, /*exact=*/false);
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) throw Error("cannot write " + temporary + ": " + std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(saved.length)) != 0 || ::lseek(fd, static_cast<off_t>(saved.length), SEEK_SET) < 0) {
      const int err = errno;
      ::close(fd);
      throw Error("cannot continue " + temporary + ": " + std::strerror(err));
    }
    std::FILE* stream = ::fdopen(fd, "wb");  // fdopen never truncates
    if (!stream) {
      ::close(fd);
      throw Error("cannot write " + temporary + ": " + std::strerror(errno));
    }
    abandon(/*keep=*/false);
    stream_ = stream;
    temporary_ = temporary;
  }
  /// For a resumed run: takes over the earlier run's finished (closed, not yet renamed) partial
  /// file of this target, of exactly `saved.length` bytes, to publish it at the end as if this run
  /// had written it. The temporary opened for this run goes.
  void adopt_finished(const SavedOutput& saved) {
    const std::string temporary = checked_partial(saved, /*exact=*/true);
    abandon(/*keep=*/false);
    temporary_ = temporary;
  }
  /// A one-file sink's checkpoint (save_state): checkpoint_state(), written.
  void save(StateWriter& w) { checkpoint_state().save(w); }
  /// A one-file sink's resume (restore_state): with the same target, the earlier run's file goes
  /// on (found under its partial name, or under the target's when that run published it at the
  /// checkpoint's stop); given another path, this run writes its own file there.
  void restore(StateReader& r) {
    const SavedOutput saved = SavedOutput::load(r);
    if (saved.partial.empty() || !is_open() || target_.write_through || saved.target != absolute_path(target_.path)) return;
    reclaim_partial(saved, {target_.path}, storage_);
    continue_from(saved);
  }
  /// Closes without renaming; `keep` leaves the .partial file for the user to see, else it goes.
  void abandon(bool keep) {
    close_stream();
    if (!keep && !temporary_.empty()) ::unlink(temporary_.c_str());
    if (!keep) temporary_.clear();
  }

 private:
  // The earlier run's partial file of this target, checked to be one, to exist as a regular file
  // and to hold `saved.length` bytes (at least, or exactly).
  std::string checked_partial(const SavedOutput& saved, bool exact) const {
    SavedOutput of_this_target = saved;
    of_this_target.target = absolute_path(target_.path);
    of_this_target.check_partial_of_target();
    struct stat st {};
    if (::lstat(saved.partial.c_str(), &st) != 0)
      throw Error("the output written before the checkpoint, " + saved.partial + ", is gone (" + std::strerror(errno) + "); run again");
    if (!S_ISREG(st.st_mode))
      throw Error("the checkpoint's output " + saved.partial + " is " + file_kind_name(st.st_mode) + ", not the file it wrote");
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size < saved.length || (exact && size != saved.length))
      throw Error("the checkpoint's output " + saved.partial + " holds " + std::to_string(size) + " bytes, not the " +
                  std::to_string(saved.length) + " written before the checkpoint: it was cut or replaced since; run again");
    return saved.partial;
  }
 public:
  /// The process's umask, which outputs made with owner-only modes (mkostemp, mkdtemp) take on
  /// before they are published. Read from /proc, not by setting umask(), which would race with
  /// other threads creating files.
  static mode_t current_umask() {
    static const mode_t mask = [] {
      mode_t value = 022;
      if (std::FILE* status = std::fopen("/proc/self/status", "r")) {
        char line[256];
        while (std::fgets(line, sizeof line, status))
          if (std::strncmp(line, "Umask:", 6) == 0) value = static_cast<mode_t>(std::strtoul(line + 6, nullptr, 8));
        std::fclose(status);
      }
      return value;
    }();
    return mask;
  }

 private:
  void close_stream() {
    if (stream_) std::fclose(stream_);
    stream_ = nullptr;
  }

  std::string requested_, temporary_;
  OutputTarget target_;
  std::FILE* stream_ = nullptr;
  Storage* storage_ = nullptr;
};

}  // namespace sluice
