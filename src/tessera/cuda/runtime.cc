#include "tessera/cuda/runtime.h"

#include <algorithm>
#include <utility>

namespace tessera::cuda {

void check(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return;
  throw Error(detail::concat("cuda: ", what, " failed: ", cudaGetErrorString(e)));
}

void check_launch(std::string_view kernel) {
  check(cudaGetLastError(), detail::concat("launch of ", kernel));
}

int device_count() {
  int n = 0;
  // No driver or no device: an error, not sticky; clear it so that no later check reports it.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

bool available() {
  return device_count() > 0;
}

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device),
        detail::concat("cudaGetDeviceProperties of device ", device));
  DeviceInfo d;
  d.index = device;
  d.name = p.name;
  d.sm_count = p.multiProcessorCount;
  d.major = p.major;
  d.minor = p.minor;
  d.total_bytes = p.totalGlobalMem;
  d.l2_bytes = static_cast<size_t>(p.l2CacheSize);
  return d;
}

double bf16_peak_flops(const DeviceInfo& d) {
  // Dense (no 2:4 sparsity) bf16 tensor-core peaks of the SXM parts, from NVIDIA's datasheets:
  //   H100 SXM: 1,979 TFLOPS with sparsity, 989.4 dense (NVIDIA H100 Tensor Core GPU datasheet;
  //             H800 SXM: the same figures); H200 SXM: 1,979 with sparsity, 989 dense (NVIDIA H200
  //             Tensor Core GPU datasheet, the same Hopper GH100 compute as H100 SXM);
  //   A100: 312 TFLOPS dense, 624 with sparsity (NVIDIA A100 Tensor Core GPU datasheet).
  // The PCIe / NVL parts run lower clocks (H100 PCIe 756 dense): MFU reported against the SXM
  // figure is then an underestimate.
  const std::string& n = d.name;
  if (n.find("H100") != std::string::npos || n.find("H200") != std::string::npos ||
      n.find("H800") != std::string::npos)
    return 989.4e12;
  if (n.find("A100") != std::string::npos) return 312e12;
  return 0.0;
}

// ---- Stream -------------------------------------------------------------------------------------

Stream::Stream() {
  check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

Stream::~Stream() {
  if (s_ != nullptr) (void)cudaStreamDestroy(s_);  // never throws from a destructor
}

void Stream::synchronize() const {
  check(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
}

// ---- DeviceAllocator ----------------------------------------------------------------------------

DeviceAllocator::DeviceAllocator(std::string name, size_t capacity_bytes)
    : name_(std::move(name)), capacity_(capacity_bytes) {}

DeviceAllocator::~DeviceAllocator() {
  // Blocks still held (an owner outlived its allocator): release them; errors are ignored, a
  // destructor does not throw.
  for (const auto& [p, b] : blocks_) (void)cudaFree(p);
}

void* DeviceAllocator::allocate(size_t bytes, MemCategory cat, std::string_view tag) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  // "; largest holders: a 1.50 GiB; b 12.00 MiB": the five largest by tag, as the CPU allocator's.
  auto holders = [&] {
    std::map<std::string_view, size_t> by_tag;
    for (const auto& [p, b] : blocks_) by_tag[b.tag] += b.bytes;
    std::vector<std::pair<size_t, std::string_view>> top;
    for (const auto& [t, n] : by_tag) top.emplace_back(n, t);
    std::sort(top.rbegin(), top.rend());
    std::string s = "; largest holders:";
    for (size_t i = 0; i < std::min<size_t>(5, top.size()); ++i)
      s += detail::concat(i ? "; " : " ", top[i].second, " ", format_bytes(top[i].first));
    return s;
  };
  if (capacity_ != 0 && in_use_ + bytes > capacity_) {
    throw OutOfMemory(detail::concat(name_, ": out of memory: requested ", format_bytes(bytes),
                                     " for '", tag, "' (", mem_category_name(cat), ") with ",
                                     format_bytes(in_use_), " of ", format_bytes(capacity_),
                                     " in use", holders()));
  }
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // an allocation failure is not sticky: clear it
    size_t free_b = 0, total_b = 0;
    std::string device = "the device's free memory unknown";
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      device = detail::concat(format_bytes(free_b), " of ", format_bytes(total_b),
                              " free on the device");
    else
      (void)cudaGetLastError();
    throw OutOfMemory(detail::concat(
        name_, ": out of memory: cudaMalloc of ", format_bytes(bytes), " for '", tag, "' (",
        mem_category_name(cat), ") failed: ", cudaGetErrorString(e), " with ", device, " and ",
        format_bytes(in_use_), " in use by this allocator", holders()));
  }
  blocks_.emplace(p, Block{bytes, cat, std::string(tag)});
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  const auto ci = static_cast<int>(cat);
  cat_in_use_[ci] += bytes;
  cat_peak_[ci] = std::max(cat_peak_[ci], cat_in_use_[ci]);
  return p;
}

void DeviceAllocator::deallocate(void* p) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(p);
  TESSERA_ASSERT(it != blocks_.end(), name_, ": deallocate of a pointer it did not allocate");
  // Errors ignored: a failed cudaFree is a sticky error from an earlier fault, which the next
  // checked call reports; this runs in destructors, possibly while that error unwinds.
  (void)cudaFree(p);
  in_use_ -= it->second.bytes;
  cat_in_use_[static_cast<int>(it->second.cat)] -= it->second.bytes;
  blocks_.erase(it);
}

size_t DeviceAllocator::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}
size_t DeviceAllocator::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}
size_t DeviceAllocator::in_use(MemCategory c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return cat_in_use_[static_cast<int>(c)];
}
size_t DeviceAllocator::peak(MemCategory c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return cat_peak_[static_cast<int>(c)];
}

// ---- Copies -------------------------------------------------------------------------------------

void copy_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
        detail::concat("cudaMemcpyAsync of ", format_bytes(static_cast<double>(bytes)),
                       " to the device"));
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after a copy to the device");
}

void copy_to_host(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream),
        detail::concat("cudaMemcpyAsync of ", format_bytes(static_cast<double>(bytes)),
                       " to the host"));
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after a copy to the host");
}

}  // namespace tessera::cuda
