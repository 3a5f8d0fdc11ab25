// Per-rank memory accounting. Every tensor's storage comes from an Allocator, which tracks the
// bytes in use and the peak per category and enforces an optional capacity, so a CPU rank can
// emulate a device with a fixed amount of memory (`--memory-limit 2GiB`).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "tessera/core/error.h"

namespace tessera {

enum class MemCategory : uint8_t {
  Parameters,
  Gradients,
  OptimizerState,
  Activations,
  Buffers,
  Other,
};
inline constexpr int kNumMemCategories = 6;
std::string_view mem_category_name(MemCategory c);

// Thrown when an allocation would exceed the allocator's capacity. The message names the rank
// (allocator name), the request, and the largest current holders.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// What an allocator hands out: memory, or address space only. A planner builds a model against an
// allocator of address space only to measure what the model allocates, to the byte, without the
// memory (plan/measure.h): its tensors are never filled (Tensor::zero_ skips them), and any read
// or write of them faults, which keeps the measuring honest.
enum class Backing { Memory, AddressSpaceOnly };

class Allocator {
 public:
  // capacity_bytes == 0 means unlimited.
  explicit Allocator(std::string name = "rank 0", size_t capacity_bytes = 0,
                     Backing backing = Backing::Memory);
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // 64-byte aligned, uninitialised. `tag` names the holder (e.g. "h.3.mlp.c_fc.weight").
  void* allocate(size_t bytes, MemCategory cat, std::string_view tag);
  void deallocate(void* p, size_t bytes, MemCategory cat, std::string_view tag);

  const std::string& name() const { return name_; }
  // Backing::AddressSpaceOnly: the bytes are counted, not backed.
  bool counts_only() const { return backing_ == Backing::AddressSpaceOnly; }
  size_t capacity() const;
  void set_capacity(size_t bytes);
  size_t in_use() const;
  size_t peak() const;
  size_t in_use(MemCategory c) const;
  size_t peak(MemCategory c) const;
  void reset_peaks();
  // One line per category: in use and peak, human readable.
  std::string report() const;

  // The allocator that Tensor factories use on this thread when none is given. Each rank (a
  // thread, or a process) installs its own with CurrentAllocatorScope. Defaults to an untracked,
  // unlimited allocator shared by the process.
  static Allocator& current();

 private:
  friend class CurrentAllocatorScope;
  std::string name_;
  Backing backing_;
  mutable std::mutex mu_;
  size_t capacity_;
  size_t in_use_ = 0;
  size_t peak_ = 0;
  std::array<size_t, kNumMemCategories> cat_in_use_{};
  std::array<size_t, kNumMemCategories> cat_peak_{};
  std::map<std::string, size_t, std::less<>> holders_;  // tag -> bytes held
};

// Makes `a` the current allocator of this thread for the scope's lifetime.
class CurrentAllocatorScope {
 public:
  explicit CurrentAllocatorScope(Allocator& a);
  ~CurrentAllocatorScope();
  CurrentAllocatorScope(const CurrentAllocatorScope&) = delete;
  CurrentAllocatorScope& operator=(const CurrentAllocatorScope&) = delete;

 private:
  Allocator* previous_;
};

// "1.50 GiB", "12.0 MiB", "512 B".
std::string format_bytes(double bytes);
// Parses "2GiB", "512MiB", "1.5GB", "1000000" (bytes). Throws ConfigError on bad input.
size_t parse_bytes(std::string_view text);

}  // namespace tessera
