// The CUDA runtime as tessera uses it: errors that name the call, the device, streams, and device
// memory with the CPU allocator's accounting (a capacity, categories, the largest holders in an
// out-of-memory message), so `--memory-limit` means the same on a GPU rank.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/error.h"

namespace tessera::cuda {

// Throws tessera::Error "cuda: <what> failed: <cudaGetErrorString>" unless e == cudaSuccess.
void check(cudaError_t e, std::string_view what);
// check(cudaGetLastError()) after a kernel launch, naming the kernel.
void check_launch(std::string_view kernel);

// How many CUDA devices this process sees (0 when there is no driver or no device; never throws).
int device_count();
bool available();

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  int major = 0, minor = 0;  // compute capability
  size_t total_bytes = 0;
  size_t l2_bytes = 0;
};
DeviceInfo device_info(int device);

// Dense bf16 tensor-core peak in FLOP/s of a device, from its name (datasheet figures: H100/H200
// SXM 989e12, A100 312e12); 0 when unknown (MFU is then not reported).
double bf16_peak_flops(const DeviceInfo& d);

// An owning CUDA stream (non-blocking with respect to the legacy default stream).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

// Device memory with the CPU allocator's accounting: a capacity (0: only the device's own limit),
// bytes in use and the peak per category, and an OutOfMemory that names the allocator, the
// request and the largest holders. Plain cudaMalloc/cudaFree underneath (a model allocates once,
// up front); thread-safe.
class DeviceAllocator {
 public:
  explicit DeviceAllocator(std::string name = "cuda rank 0", size_t capacity_bytes = 0);
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  void* allocate(size_t bytes, MemCategory cat, std::string_view tag);
  void deallocate(void* p);

  const std::string& name() const { return name_; }
  size_t capacity() const { return capacity_; }
  size_t in_use() const;
  size_t peak() const;
  size_t in_use(MemCategory c) const;
  size_t peak(MemCategory c) const;

 private:
  struct Block {
    size_t bytes;
    MemCategory cat;
    std::string tag;
  };
  std::string name_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::map<void*, Block> blocks_;
  size_t in_use_ = 0, peak_ = 0;
  size_t cat_in_use_[kNumMemCategories] = {};
  size_t cat_peak_[kNumMemCategories] = {};
};

// An owning typed device array from a DeviceAllocator (moveable). Contents uninitialised.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(DeviceAllocator& a, int64_t n, MemCategory cat, std::string_view tag)
      : alloc_(&a), n_(n) {
    if (n > 0) p_ = static_cast<T*>(a.allocate(sizeof(T) * static_cast<size_t>(n), cat, tag));
  }
  ~DeviceArray() { reset(); }
  DeviceArray(DeviceArray&& o) noexcept : alloc_(o.alloc_), p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = o.alloc_;
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  void reset() {
    if (p_ != nullptr) alloc_->deallocate(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* get() const { return p_; }
  int64_t size() const { return n_; }
  size_t bytes() const { return sizeof(T) * static_cast<size_t>(n_); }

 private:
  DeviceAllocator* alloc_ = nullptr;
  T* p_ = nullptr;
  int64_t n_ = 0;
};

// Synchronous copies on `stream` (the call returns when the copy is done).
void copy_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream);
void copy_to_host(void* dst, const void* src, size_t bytes, cudaStream_t stream);
template <typename T>
std::vector<T> to_host(const T* src, int64_t n, cudaStream_t stream) {
  std::vector<T> v(static_cast<size_t>(n));
  copy_to_host(v.data(), src, sizeof(T) * v.size(), stream);
  return v;
}

}  // namespace tessera::cuda
