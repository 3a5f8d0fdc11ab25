#include "tessera/comm/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "tessera/comm/errors.h"

namespace tessera::comm::detail {
namespace {

constexpr size_t kBlock = 1024;  // elements per block: the accumulator stays in L1

struct SumF {
  template <typename T>
  T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxF {
  template <typename T>
  T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};
struct MinF {
  template <typename T>
  T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};

template <typename T, typename F>
void reduce_typed(T* dst, const void* const* srcs, int k, size_t count, F f, int div) {
  alignas(64) T acc[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t m = std::min(kBlock, count - b);
    const T* s0 = static_cast<const T*>(srcs[0]) + b;
    for (size_t i = 0; i < m; ++i) acc[i] = s0[i];
    for (int j = 1; j < k; ++j) {
      const T* sj = static_cast<const T*>(srcs[j]) + b;
      for (size_t i = 0; i < m; ++i) acc[i] = f(acc[i], sj[i]);
    }
    if (div > 0) {
      const T d = static_cast<T>(div);
      for (size_t i = 0; i < m; ++i) acc[i] = acc[i] / d;
    }
    std::memcpy(dst + b, acc, m * sizeof(T));
  }
}

inline float bf(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

template <typename F>
void reduce_bf16(uint16_t* dst, const void* const* srcs, int k, size_t count, F f, int div) {
  alignas(64) float acc[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t m = std::min(kBlock, count - b);
    const uint16_t* s0 = static_cast<const uint16_t*>(srcs[0]) + b;
    for (size_t i = 0; i < m; ++i) acc[i] = bf(s0[i]);
    for (int j = 1; j < k; ++j) {
      const uint16_t* sj = static_cast<const uint16_t*>(srcs[j]) + b;
      for (size_t i = 0; i < m; ++i) acc[i] = f(acc[i], bf(sj[i]));
    }
    if (div > 0)
      for (size_t i = 0; i < m; ++i) acc[i] /= static_cast<float>(div);
    for (size_t i = 0; i < m; ++i) dst[b + i] = to_bf16(acc[i]).bits;
  }
}

template <typename F>
void dispatch(void* dst, const void* const* srcs, int k, size_t count, DType dtype, F f, int div) {
  switch (dtype) {
    case DType::F32:
      reduce_typed(static_cast<float*>(dst), srcs, k, count, f, div);
      return;
    case DType::I32:
      reduce_typed(static_cast<int32_t*>(dst), srcs, k, count, f, div);
      return;
    case DType::I64:
      reduce_typed(static_cast<int64_t*>(dst), srcs, k, count, f, div);
      return;
    case DType::BF16:
      reduce_bf16(static_cast<uint16_t*>(dst), srcs, k, count, f, div);
      return;
    default:
      throw CommUsageError(concat("reductions do not support dtype ", dtype_name(dtype)));
  }
}

}  // namespace

void reduce_n(void* dst, const void* const* srcs, int k, size_t count, DType dtype, ReduceOp op,
              int mean_divisor) {
  if (count == 0) return;
  switch (op) {
    case ReduceOp::Sum:
      dispatch(dst, srcs, k, count, dtype, SumF{}, 0);
      return;
    case ReduceOp::Mean:
      dispatch(dst, srcs, k, count, dtype, SumF{}, mean_divisor);
      return;
    case ReduceOp::Max:
      dispatch(dst, srcs, k, count, dtype, MaxF{}, 0);
      return;
    case ReduceOp::Min:
      dispatch(dst, srcs, k, count, dtype, MinF{}, 0);
      return;
  }
}

void divide(void* buf, size_t count, DType dtype, int divisor) {
  const void* srcs[1] = {buf};
  if (count) dispatch(buf, srcs, 1, count, dtype, SumF{}, divisor);
}

}  // namespace tessera::comm::detail
