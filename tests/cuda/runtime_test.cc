#include "tessera/cuda/runtime.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "tessera/cuda/gemm.h"

namespace tessera::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Without a device too: available() answers (false here), it does not throw.
TEST(CudaRuntime, AvailableAnswersWithoutThrowing) {
  bool a = true;
  EXPECT_NO_THROW(a = available());
  EXPECT_EQ(a, device_count() > 0);
}

// Pure functions: no device needed.
TEST(CudaRuntime, ErrorsNameTheCall) {
  EXPECT_NO_THROW(check(cudaSuccess, "cudaMemset"));
  try {
    check(cudaErrorInvalidValue, "cudaMemset of 'x'");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), std::string("cuda: cudaMemset of 'x' failed: ") +
                                         cudaGetErrorString(cudaErrorInvalidValue));
  }
  try {
    check_cublas(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cublas: cublasGemmEx failed: CUBLAS_STATUS_INVALID_VALUE");
  }
}

TEST(CudaRuntime, PeakFlopsByName) {
  DeviceInfo d;
  d.name = "NVIDIA H200";
  EXPECT_DOUBLE_EQ(bf16_peak_flops(d), 989.4e12);
  d.name = "NVIDIA H100 80GB HBM3";
  EXPECT_DOUBLE_EQ(bf16_peak_flops(d), 989.4e12);
  d.name = "NVIDIA A100-SXM4-80GB";
  EXPECT_DOUBLE_EQ(bf16_peak_flops(d), 312e12);
  d.name = "NVIDIA GeForce RTX 4090";
  EXPECT_EQ(bf16_peak_flops(d), 0.0);
}

TEST(CudaRuntime, DeviceInfo) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  const DeviceInfo d = device_info(0);
  EXPECT_EQ(d.index, 0);
  EXPECT_FALSE(d.name.empty());
  EXPECT_GT(d.sm_count, 0);
  EXPECT_GE(d.major, 7);
  EXPECT_GT(d.total_bytes, size_t{0});
  EXPECT_GT(d.l2_bytes, size_t{0});
  EXPECT_THROW(device_info(device_count()), Error);
}

TEST(DeviceAllocator, AccountsInUseAndPeakPerCategory) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  DeviceAllocator a("cuda test", 0);
  EXPECT_EQ(a.name(), "cuda test");
  EXPECT_EQ(a.capacity(), size_t{0});
  void* w = a.allocate(1 * kMiB, MemCategory::Parameters, "wte");
  void* x = a.allocate(3 * kMiB, MemCategory::Activations, "h.0.ln_1");
  void* y = a.allocate(2 * kMiB, MemCategory::Activations, "h.1.ln_1");
  ASSERT_NE(w, nullptr);
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(a.in_use(), 6 * kMiB);
  EXPECT_EQ(a.peak(), 6 * kMiB);
  EXPECT_EQ(a.in_use(MemCategory::Parameters), 1 * kMiB);
  EXPECT_EQ(a.in_use(MemCategory::Activations), 5 * kMiB);
  EXPECT_EQ(a.in_use(MemCategory::Gradients), size_t{0});
  a.deallocate(x);
  EXPECT_EQ(a.in_use(), 3 * kMiB);
  EXPECT_EQ(a.peak(), 6 * kMiB);
  EXPECT_EQ(a.in_use(MemCategory::Activations), 2 * kMiB);
  EXPECT_EQ(a.peak(MemCategory::Activations), 5 * kMiB);
  void* g = a.allocate(4 * kMiB, MemCategory::Gradients, "wte.grad");
  EXPECT_EQ(a.in_use(), 7 * kMiB);
  EXPECT_EQ(a.peak(), 7 * kMiB);
  EXPECT_EQ(a.peak(MemCategory::Gradients), 4 * kMiB);
  a.deallocate(g);
  a.deallocate(y);
  a.deallocate(w);
  a.deallocate(nullptr);  // a no-op
  EXPECT_EQ(a.in_use(), size_t{0});
  EXPECT_EQ(a.peak(), 7 * kMiB);
  EXPECT_EQ(a.peak(MemCategory::Parameters), 1 * kMiB);
  // Zero bytes: no memory, nothing counted.
  EXPECT_EQ(a.allocate(0, MemCategory::Other, "empty"), nullptr);
  EXPECT_EQ(a.in_use(), size_t{0});
}

TEST(DeviceAllocator, OverCapacityThrowsNamingTheAllocatorRequestAndHolders) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  DeviceAllocator a("cuda rank 3", 4 * kMiB);
  void* p = a.allocate(3 * kMiB, MemCategory::Parameters, "h.0.attn.c_attn.weight");
  try {
    a.allocate(2 * kMiB, MemCategory::Activations, "h.1.mlp.fc");
    FAIL() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda rank 3: out of memory"), std::string::npos) << m;
    EXPECT_NE(m.find("requested 2.00 MiB for 'h.1.mlp.fc' (activations)"), std::string::npos) << m;
    EXPECT_NE(m.find("3.00 MiB of 4.00 MiB in use"), std::string::npos) << m;
    EXPECT_NE(m.find("largest holders: h.0.attn.c_attn.weight 3.00 MiB"), std::string::npos) << m;
  }
  EXPECT_EQ(a.in_use(), 3 * kMiB);  // the refused request is not counted
  EXPECT_EQ(a.peak(), 3 * kMiB);
  void* q = a.allocate(1 * kMiB, MemCategory::Activations, "h.1.mlp.fc");  // exactly full
  EXPECT_EQ(a.in_use(), 4 * kMiB);
  a.deallocate(q);
  a.deallocate(p);
  EXPECT_EQ(a.in_use(), size_t{0});
}

TEST(DeviceAllocator, DeviceRefusalIsOutOfMemoryWithTheDevicesMemory) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  DeviceAllocator a("cuda rank 0", 0);
  const size_t too_much = device_info(0).total_bytes * 4;
  try {
    a.allocate(too_much, MemCategory::Activations, "huge");
    FAIL() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda rank 0: out of memory: cudaMalloc of "), std::string::npos) << m;
    EXPECT_NE(m.find("'huge' (activations)"), std::string::npos) << m;
    EXPECT_NE(m.find("free on the device"), std::string::npos) << m;
  }
  EXPECT_EQ(a.in_use(), size_t{0});
  // The failure is cleared: the next checked call does not report it.
  EXPECT_NO_THROW(check_launch("nothing"));
  void* p = a.allocate(kMiB, MemCategory::Other, "small");
  EXPECT_NE(p, nullptr);
  a.deallocate(p);
}

TEST(DeviceArray, MovesOwnershipAndRoundTripsThroughTheHost) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  DeviceAllocator a("cuda test", 0);
  Stream stream;
  DeviceArray<float> x(a, 1000, MemCategory::Buffers, "x");
  EXPECT_EQ(x.size(), 1000);
  EXPECT_EQ(x.bytes(), 4000u);
  EXPECT_EQ(a.in_use(), 4000u);
  std::vector<float> host(1000);
  std::iota(host.begin(), host.end(), 0.5f);
  copy_to_device(x.get(), host.data(), x.bytes(), stream.get());

  float* p = x.get();
  DeviceArray<float> y(std::move(x));
  EXPECT_EQ(x.get(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(x.size(), 0);
  EXPECT_EQ(y.get(), p);
  EXPECT_EQ(y.size(), 1000);
  EXPECT_EQ(a.in_use(), 4000u);  // moved, not copied
  EXPECT_EQ(to_host(y.get(), y.size(), stream.get()), host);

  DeviceArray<float> z(a, 10, MemCategory::Buffers, "z");
  EXPECT_EQ(a.in_use(), 4040u);
  z = std::move(y);  // z's own block is released
  EXPECT_EQ(a.in_use(), 4000u);
  EXPECT_EQ(z.get(), p);
  EXPECT_EQ(y.get(), nullptr);  // NOLINT(bugprone-use-after-move)
  {
    DeviceArray<float> empty;
    EXPECT_EQ(empty.get(), nullptr);
    EXPECT_EQ(empty.size(), 0);
  }
  z.reset();
  EXPECT_EQ(z.get(), nullptr);
  EXPECT_EQ(a.in_use(), size_t{0});
  EXPECT_EQ(a.peak(), 4040u);
  stream.synchronize();
}

}  // namespace
}  // namespace tessera::cuda
