#pragma once
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace sluice {

/// A block of bytes with an owner. Tensors hold buffers through shared_ptr, so slices and record
/// views of one read buffer share it without copying. Small buffers keep their bytes inline, so a
/// scalar costs one allocation.
class Buffer {
 public:
  using Release = std::function<void(std::byte*, std::size_t)>;
  static constexpr std::size_t kInlineBytes = 32;

  /// Owned memory: inline when small, otherwise 64-byte aligned heap memory.
  explicit Buffer(std::size_t size) : size_(size) {
    if (size <= kInlineBytes) {
      data_ = inline_;
    } else {
      data_ = static_cast<std::byte*>(::operator new(size, std::align_val_t{64}));
      release_ = [](std::byte* p, std::size_t) { ::operator delete(p, std::align_val_t{64}); };
    }
  }
  /// Memory owned elsewhere (a pool, pinned memory, a mapped file): release is called once.
  Buffer(std::byte* data, std::size_t size, Release release)
      : data_(data), size_(size), release_(std::move(release)) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (release_) release_(data_, size_);
  }

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  Release release_;
  alignas(16) std::byte inline_[kInlineBytes];
};

/// Where a stage's output buffers come from. A downstream stage may offer its allocator upstream
/// (pinned memory for a GPU feed), so a batch is assembled once, where it will be used.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual std::shared_ptr<Buffer> allocate(std::size_t bytes) = 0;
  virtual const char* name() const = 0;
};

class HostAllocator final : public Allocator {
 public:
  std::shared_ptr<Buffer> allocate(std::size_t bytes) override { return std::make_shared<Buffer>(bytes); }
  const char* name() const override { return "host"; }
  static HostAllocator& instance() {
    static HostAllocator allocator;
    return allocator;
  }
};

/// Reuses released blocks of the same size: fresh pages cost far more than reused ones for large
/// batch buffers (and pinned pages far more again). Blocks return to the pool when the last tensor
/// viewing them is gone, even after the pool object itself was destroyed (they are then freed).
/// Blocks come from plain aligned host memory unless a BlockSource says otherwise (pinned memory).
class PooledHostAllocator final : public Allocator {
 public:
  struct Counters {
    std::uint64_t fresh_allocations = 0;
    std::uint64_t reused_allocations = 0;
    std::uint64_t blocks_pooled = 0;
  };
  struct BlockSource {
    std::function<std::byte*(std::size_t)> allocate;
    std::function<void(std::byte*)> free;
  };

  PooledHostAllocator() : PooledHostAllocator("pooled-host", {}) {}
  PooledHostAllocator(std::string name, BlockSource source) : state_(std::make_shared<State>()) {
    state_->name = std::move(name);
    state_->source = std::move(source);
  }

  std::shared_ptr<Buffer> allocate(std::size_t bytes) override {
    std::byte* block = nullptr;
    {
      std::lock_guard lock(state_->mutex);
      auto& free_list = state_->free_blocks[bytes];
      if (!free_list.empty()) {
        block = free_list.back();
        free_list.pop_back();
        ++state_->counters.reused_allocations;
        --state_->counters.blocks_pooled;
      } else {
        ++state_->counters.fresh_allocations;
      }
    }
    if (!block) {
      block = state_->allocate_block(bytes);
      std::lock_guard lock(state_->mutex);
      state_->owned[block] = bytes;
    }
    std::weak_ptr<State> weak = state_;
    auto source = state_->source.free;
    return std::make_shared<Buffer>(block, bytes, [weak, source](std::byte* p, std::size_t size) {
      if (auto state = weak.lock()) {
        std::lock_guard lock(state->mutex);
        state->free_blocks[size].push_back(p);
        ++state->counters.blocks_pooled;
        return;
      }
      State::free_block(source, p);
    });
  }
  const char* name() const override { return state_->name.c_str(); }
  Counters counters() const {
    std::lock_guard lock(state_->mutex);
    return state_->counters;
  }
  /// True when [p, p + bytes) lies inside one block of this pool (pinned memory that needs no
  /// staging copy, say).
  bool owns(const std::byte* p, std::size_t bytes) const {
    std::lock_guard lock(state_->mutex);
    auto it = state_->owned.upper_bound(const_cast<std::byte*>(p));
    if (it == state_->owned.begin()) return false;
    --it;
    return p >= it->first && p + bytes <= it->first + it->second;
  }

 private:
  struct State {
    std::string name;
    BlockSource source;
    mutable std::mutex mutex;
    std::map<std::size_t, std::vector<std::byte*>> free_blocks;
    std::map<std::byte*, std::size_t> owned;  // every block made, by address
    Counters counters;
    std::byte* allocate_block(std::size_t bytes) const {
      if (source.allocate) return source.allocate(bytes ? bytes : 1);
      return static_cast<std::byte*>(::operator new(bytes ? bytes : 1, std::align_val_t{64}));
    }
    static void free_block(const std::function<void(std::byte*)>& free, std::byte* p) {
      if (free) free(p);
      else ::operator delete(p, std::align_val_t{64});
    }
    ~State() {
      for (auto& [size, blocks] : free_blocks)
        for (std::byte* p : blocks) free_block(source.free, p);
    }
  };
  std::shared_ptr<State> state_;
};

}  // namespace sluice
