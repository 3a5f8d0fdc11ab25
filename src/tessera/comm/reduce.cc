#include "tessera/comm/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

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

// One 64-byte line to `p` (64-byte aligned) with a non-temporal store.
inline void stream_line(void* p, const void* line) {
#if defined(__SANITIZE_THREAD__) || !defined(__SSE2__)
  std::memcpy(p, line, 64);
#elif defined(__AVX512F__)
  _mm512_stream_si512(static_cast<__m512i*>(p), _mm512_loadu_si512(line));
#else
  for (int q = 0; q < 4; ++q)
    _mm_stream_si128(static_cast<__m128i*>(p) + q,
                     _mm_loadu_si128(static_cast<const __m128i*>(line) + q));
#endif
}

// memcpy into memory this thread will not read again: non-temporal stores skip the
// read-for-ownership of a normal store (a third of a copy's memory traffic). The caller fences.
void copy_streaming(unsigned char* dst, const unsigned char* src, size_t n) {
  const size_t head = std::min(n, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  const size_t body = n / 64 * 64;
  for (size_t i = 0; i < body; i += 64) stream_line(dst + i, src + i);
  std::memcpy(dst + body, src + body, n - body);
}

// Where a reduced block goes: every destination, at the same element offset.
struct Dsts {
  void* const* ptrs;
  int n;
  bool streaming;
  template <typename T>
  void write(size_t offset, const T* block, size_t m) const {
    for (int i = 0; i < n; ++i) {
      auto* d = reinterpret_cast<unsigned char*>(static_cast<T*>(ptrs[i]) + offset);
      if (streaming)
        copy_streaming(d, reinterpret_cast<const unsigned char*>(block), m * sizeof(T));
      else
        std::memcpy(d, block, m * sizeof(T));
    }
  }
};

// Blocks [from, to) through an L1-resident accumulator, then to every destination.
template <typename T, typename F>
void reduce_typed_blocks(const Dsts& dst, const void* const* srcs, int k, size_t from, size_t to,
                         F f, int div) {
  alignas(64) T acc[kBlock];
  for (size_t b = from; b < to; b += kBlock) {
    const size_t m = std::min(kBlock, to - b);
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
    dst.write(b, acc, m);
  }
}

// Streaming fast path: `lines` whole 64-byte lines from element `start`, every destination
// 64-byte aligned there. Each line is loaded from every source, combined in registers and stored
// to every destination at once: loads and stores stay interleaved, which keeps more memory
// requests in flight than the accumulator's separate read and write phases (faster at 16 MiB on
// 2 threads; the figures are in docs/PERFORMANCE.md, "Collectives").
template <typename T, typename F>
void reduce_typed_lines(const Dsts& dst, const void* const* srcs, int k, size_t start, size_t lines,
                        int div) {
  constexpr size_t kLine = 64 / sizeof(T);
  typedef T V __attribute__((vector_size(64)));
  for (size_t l = 0; l < lines; ++l) {
    const size_t i = start + l * kLine;
    V v, w;
    std::memcpy(&v, static_cast<const T*>(srcs[0]) + i, 64);
    for (int j = 1; j < k; ++j) {
      std::memcpy(&w, static_cast<const T*>(srcs[j]) + i, 64);
      if constexpr (std::is_same_v<F, SumF>)
        v += w;
      else if constexpr (std::is_same_v<F, MaxF>)
        v = v < w ? w : v;
      else
        v = w < v ? w : v;
    }
    if (div > 0) v = v / static_cast<T>(div);
    for (int d = 0; d < dst.n; ++d) stream_line(static_cast<T*>(dst.ptrs[d]) + i, &v);
  }
}

template <typename T, typename F>
void reduce_typed(const Dsts& dst, const void* const* srcs, int k, size_t count, F f, int div) {
  size_t done = 0;
  if (dst.streaming) {
    // The fast path needs every destination at the same offset from a 64-byte boundary.
    const uintptr_t mis = reinterpret_cast<uintptr_t>(dst.ptrs[0]) % 64;
    bool same = mis % sizeof(T) == 0;
    for (int d = 1; d < dst.n; ++d)
      same = same && reinterpret_cast<uintptr_t>(dst.ptrs[d]) % 64 == mis;
    const size_t head = std::min(count, (64 - mis) % 64 / sizeof(T));
    const size_t lines = same ? (count - head) / (64 / sizeof(T)) : 0;
    if (lines > 0) {
      reduce_typed_blocks<T>(dst, srcs, k, 0, head, f, div);
      reduce_typed_lines<T, F>(dst, srcs, k, head, lines, div);
      done = head + lines * (64 / sizeof(T));
    }
  }
  reduce_typed_blocks<T>(dst, srcs, k, done, count, f, div);
}

inline float bf(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

template <typename F>
void reduce_bf16(const Dsts& dst, const void* const* srcs, int k, size_t count, F f, int div) {
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
    alignas(64) uint16_t out[kBlock];
    for (size_t i = 0; i < m; ++i) out[i] = to_bf16(acc[i]).bits;
    dst.write(b, out, m);
  }
}

template <typename F>
void dispatch(const Dsts& dst, const void* const* srcs, int k, size_t count, DType dtype, F f,
              int div) {
  switch (dtype) {
    case DType::F32:
      reduce_typed<float>(dst, srcs, k, count, f, div);
      return;
    case DType::F64:
      reduce_typed<double>(dst, srcs, k, count, f, div);
      return;
    case DType::I32:
      reduce_typed<int32_t>(dst, srcs, k, count, f, div);
      return;
    case DType::I64:
      reduce_typed<int64_t>(dst, srcs, k, count, f, div);
      return;
    case DType::BF16:
      reduce_bf16(dst, srcs, k, count, f, div);
      return;
    default:
      throw CommUsageError(concat("reductions do not support dtype ", dtype_name(dtype)));
  }
}

}  // namespace

void reduce_n(void* dst, const void* const* srcs, int k, size_t count, DType dtype, ReduceOp op,
              int mean_divisor) {
  void* const dsts[1] = {dst};
  reduce_n_to(dsts, 1, false, srcs, k, count, dtype, op, mean_divisor);
}

void reduce_n_to(void* const* dsts, int ndst, bool streaming, const void* const* srcs, int k,
                 size_t count, DType dtype, ReduceOp op, int mean_divisor) {
  if (count == 0 || ndst == 0) return;
  const Dsts dst{dsts, ndst, streaming};
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
  void* const dsts[1] = {buf};
  if (count) dispatch(Dsts{dsts, 1, false}, srcs, 1, count, dtype, SumF{}, divisor);
}

void store_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace tessera::comm::detail
