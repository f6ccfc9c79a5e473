#pragma once
// Maps pages of memory-mapped input files in ahead of the reader, on a thread of its own.
//
// Reading a mapped file page-faults every few pages: the kernel's work per fault (page tables,
// accounting) costs about as much as copying the data, and it lands on the thread that also
// checks the CRCs. Populating the mapping from a second thread (MADV_POPULATE_READ, or touching
// one byte per page on kernels older than 5.14) moves that work off the reading thread, and reads
// cold files from disk ahead of it too.
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "sluice/buffer.hpp"

namespace sluice::io {

class PagePrefetcher {
 public:
  PagePrefetcher() = default;
  PagePrefetcher(const PagePrefetcher&) = delete;
  PagePrefetcher& operator=(const PagePrefetcher&) = delete;
  ~PagePrefetcher();

  // Queues a mapping to be populated from its start; the prefetcher holds it until done. The
  // thread starts with the first mapping.
  void prefetch(std::shared_ptr<Buffer> mapping);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Buffer>> queue_;
  bool quit_ = false;
  std::thread thread_;
};

}  // namespace sluice::io
