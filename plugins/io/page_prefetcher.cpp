#include "page_prefetcher.hpp"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <vector>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

namespace sluice::io {

namespace {
// Populated per call, so that a stop or a newly queued file is noticed soon.
constexpr std::size_t kStep = 1 << 20;

void touch_pages(const std::byte* p, std::size_t n) {
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t at = 0; at < n; at += page) static_cast<void>(*static_cast<const volatile std::byte*>(p + at));
}
}  // namespace

PagePrefetcher::~PagePrefetcher() {
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PagePrefetcher::prefetch(std::shared_ptr<Buffer> mapping) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(mapping));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  wake_.notify_one();
}

void PagePrefetcher::run() {
  pthread_setname_np(pthread_self(), "page prefetch");
  bool have_populate = true;
  // Populated mappings are kept until every record viewing them is gone, so that the unmapping
  // happens here too: on the thread that drops the last record (a sink), munmap would wait for
  // the address-space lock that populating holds, and stall the pipeline.
  std::vector<std::shared_ptr<Buffer>> held;
  auto release_unused = [&] {
    std::erase_if(held, [](const std::shared_ptr<Buffer>& m) { return m.use_count() == 1; });
  };
  std::unique_lock lock(mutex_);
  for (;;) {
    if (held.empty()) wake_.wait(lock, [&] { return quit_ || !queue_.empty(); });
    else wake_.wait_for(lock, std::chrono::milliseconds(1), [&] { return quit_ || !queue_.empty(); });
    if (quit_) break;
    if (queue_.empty()) {
      lock.unlock();
      release_unused();
      lock.lock();
      continue;
    }
    std::shared_ptr<Buffer> mapping = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    release_unused();
    // A mapping only this thread holds is a file already read (or abandoned).
    for (std::size_t at = 0; at < mapping->size() && mapping.use_count() > 1; at += kStep) {
      {
        std::lock_guard check(mutex_);
        if (quit_) break;
      }
      const std::size_t n = std::min(kStep, mapping->size() - at);
      auto* p = mapping->data() + at;
      if (have_populate && ::madvise(p, n, MADV_POPULATE_READ) != 0) {
        if (errno != EINVAL) break;  // EFAULT/ENOMEM: leave the pages to ordinary faults
        have_populate = false;
      }
      if (!have_populate) touch_pages(p, n);
    }
    held.push_back(std::move(mapping));
    lock.lock();
  }
  lock.unlock();
  held.clear();  // records still alive keep their mappings; the rest are unmapped now
}

}  // namespace sluice::io
