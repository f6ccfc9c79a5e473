#pragma once
// What random_access reads with: the files it keeps open, and the threads that share out the
// positioned reads of a group of records.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "byte_source.hpp"
#include "sluice/error.hpp"

namespace sluice::io {

// Open files of the source, by file number. Reads go to any file at random, so every file stays
// open (a file opened and closed per record costs more than reading it) up to a quarter of the
// process's descriptor limit (at least 128, at most 4,096); past that, the longest open are closed.
class OpenFiles {
 public:
  OpenFiles() {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
      kept_ = std::clamp<std::size_t>(static_cast<std::size_t>(limit.rlim_cur / 4), 128, 4096);
  }
  ~OpenFiles() { close_all(); }
  void close_all() {
    for (int& fd : fds_)
      if (fd >= 0) ::close(std::exchange(fd, -1));
    opened_.clear();
  }
  int fd(std::size_t file, const std::string& path) {
    if (file >= fds_.size()) fds_.resize(file + 1, -1);
    if (fds_[file] >= 0) return fds_[file];
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw DataError("cannot read " + path + ": " + std::strerror(errno));
    opened_.push_back(file);
    return fds_[file] = fd;
  }
  // Closes the longest open files until `more` can be opened within the limit (between groups of
  // reads: never one a read in flight uses).
  void make_room(std::size_t more) {
    while (!opened_.empty() && opened_.size() + more > kept_) {
      ::close(std::exchange(fds_[opened_.front()], -1));
      opened_.pop_front();
    }
  }

 private:
  std::size_t kept_ = 256;
  std::vector<int> fds_;         // per file; -1: closed
  std::deque<std::size_t> opened_;  // the open ones, oldest first
};

// Threads that share out the reads of a group of records with the thread that asks: run(parts,
// work) calls work(0..parts-1), part 0 on the caller, and returns when every part is done.
class ReadCrew {
 public:
  explicit ReadCrew(int helpers) {
    for (int h = 0; h < helpers; ++h) threads_.emplace_back([this, h] { serve(h + 1); });
  }
  ~ReadCrew() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int size() const { return static_cast<int>(threads_.size()) + 1; }
  void run(int parts, const std::function<void(int)>& work) {
    if (parts <= 1) {
      if (parts == 1) work(0);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      work_ = &work;
      parts_ = parts;
      left_ = parts - 1;
      ++generation_;
    }
    wake_.notify_all();
    work(0);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return left_ == 0; });
    work_ = nullptr;
  }

 private:
  void serve(int part) {
    std::uint64_t seen = 0;
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
      if (quit_) return;
      seen = generation_;
      if (part >= parts_) continue;
      const auto* work = work_;
      lock.unlock();
      (*work)(part);  // (read_into_group keeps its errors: nothing is thrown here)
      lock.lock();
      if (--left_ == 0) done_.notify_one();
    }
  }
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* work_ = nullptr;
  int parts_ = 0, left_ = 0;
  std::uint64_t generation_ = 0;
  bool quit_ = false;
};

}  // namespace sluice::io
