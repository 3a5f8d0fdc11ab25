#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tessera/core/error.h"
#include "tessera/cuda/kernels.h"
#include "tessera/cuda/philox.cuh"
#include "tessera/cuda/runtime.h"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;               // elementwise and per-column kernels
constexpr int64_t kMaxBlocks = 8192;        // grid cap of the grid-stride elementwise loops
constexpr int64_t kMaxRowBlocks = 1 << 16;  // grid cap of the block-per-row kernels
constexpr unsigned kFullMask = 0xffffffffu;

// Blocks for `work` items at `per_block` items a block, at least 1 and at most `cap`.
int blocks_for(int64_t work, int64_t per_block, int64_t cap) {
  return static_cast<int>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, cap));
}

// Threads of a block that reduces rows of `len` elements: a multiple of 32 in [32, max_threads].
int row_threads(int64_t len, int max_threads) {
  return static_cast<int>(std::clamp<int64_t>((len + 31) / 32 * 32, 32, max_threads));
}

// ---- Loads and stores: fp32 compute, one rounding on store ------------------------------------

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
// Exact: the bf16 bits are the top half of the fp32 (a NaN keeps its payload, as kernels/bf16.h).
__device__ __forceinline__ float to_f32(bf16 x) {
  return __uint_as_float(static_cast<uint32_t>(__bfloat16_as_ushort(x)) << 16);
}

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
// Bitwise kernels/bf16.h's rounding: nearest, ties to even; a NaN stays a quiet NaN with its top
// bits (cvt.rn.bf16.f32 would return the canonical NaN instead).
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  const uint32_t u = __float_as_uint(x);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t r = nan ? (u | 0x00400000u) : (u + 0x7fffu + ((u >> 16) & 1u));
  return __ushort_as_bfloat16(static_cast<unsigned short>(r >> 16));
}

// ---- Reductions in a fixed order ---------------------------------------------------------------

struct SumOp {
  template <typename V>
  __device__ V operator()(V a, V b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly over a warp: every lane ends with the same value (each step adds a pair in both
// orders, and fp addition is commutative).
template <typename V, typename Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Every thread of a 1-D block (blockDim.x a multiple of 32, at most 1024) calls it; every thread
// gets the reduction of all the block's values: warps by butterfly, then the warps' results in
// warp order. buf: 32 values of shared memory, free again on return.
template <typename V, typename Op>
__device__ V block_reduce(V v, Op op, V* buf) {
  v = warp_reduce(v, op);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  V r = buf[0];
  const int warps = static_cast<int>(blockDim.x >> 5);
  for (int w = 1; w < warps; ++w) r = op(r, buf[w]);
  __syncthreads();
  return r;
}

// ---- Elementwise maps --------------------------------------------------------------------------

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T x[V];
};

// out[i] = op(a[i]) (Unary) or op(a[i], b[i]): V elements a step through aligned vector loads,
// then the n % V tail one by one. out may alias a or b: a thread reads an element, then writes it.
template <int V, typename Out, typename In, typename Op>
__global__ void map1_kernel(Out* out, const In* a, int64_t n, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t i = first; i < packs; i += stride) {
    const Pack<In, V> x = reinterpret_cast<const Pack<In, V>*>(a)[i];
    Pack<Out, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.x[k] = from_f32<Out>(op(to_f32(x.x[k])));
    reinterpret_cast<Pack<Out, V>*>(out)[i] = y;
  }
  for (int64_t i = packs * V + first; i < n; i += stride) out[i] = from_f32<Out>(op(to_f32(a[i])));
}

template <int V, typename Out, typename In, typename Op>
__global__ void map2_kernel(Out* out, const In* a, const In* b, int64_t n, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t i = first; i < packs; i += stride) {
    const Pack<In, V> x = reinterpret_cast<const Pack<In, V>*>(a)[i];
    const Pack<In, V> y = reinterpret_cast<const Pack<In, V>*>(b)[i];
    Pack<Out, V> z;
#pragma unroll
    for (int k = 0; k < V; ++k) z.x[k] = from_f32<Out>(op(to_f32(x.x[k]), to_f32(y.x[k])));
    reinterpret_cast<Pack<Out, V>*>(out)[i] = z;
  }
  for (int64_t i = packs * V + first; i < n; i += stride)
    out[i] = from_f32<Out>(op(to_f32(a[i]), to_f32(b[i])));
}

bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// 16-byte vectors of the wider type (4 floats or 8 bf16s; 4 of each for a conversion).
template <typename Out, typename In>
constexpr int kVec = static_cast<int>(16 / std::max(sizeof(Out), sizeof(In)));

template <typename Out, typename In, typename Op>
void map1(const char* name, Out* out, const In* a, int64_t n, Op op, cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int V = kVec<Out, In>;
  if (aligned(out, sizeof(Out) * V) && aligned(a, sizeof(In) * V)) {
    map1_kernel<V>
        <<<blocks_for(n / V + 1, kThreads, kMaxBlocks), kThreads, 0, stream>>>(out, a, n, op);
  } else {
    map1_kernel<1><<<blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream>>>(out, a, n, op);
  }
  check_launch(name);
}

template <typename Out, typename In, typename Op>
void map2(const char* name, Out* out, const In* a, const In* b, int64_t n, Op op,
          cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int V = kVec<Out, In>;
  if (aligned(out, sizeof(Out) * V) && aligned(a, sizeof(In) * V) && aligned(b, sizeof(In) * V)) {
    map2_kernel<V>
        <<<blocks_for(n / V + 1, kThreads, kMaxBlocks), kThreads, 0, stream>>>(out, a, b, n, op);
  } else {
    map2_kernel<1><<<blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream>>>(out, a, b, n, op);
  }
  check_launch(name);
}

struct Identity {
  __device__ float operator()(float x) const { return x; }
};
struct Scale {
  float s;
  __device__ float operator()(float x) const { return x * s; }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

struct Gelu {
  __device__ float operator()(float x) const {
    const float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    return 0.5f * x * (1.0f + t);
  }
};
struct GeluBackward {  // (dout, in)
  __device__ float operator()(float dout, float x) const {
    const float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    return (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du) * dout;
  }
};

// ---- Embedding ---------------------------------------------------------------------------------

// Blocks over the B*T rows (grid-stride), threads across the C columns of a row.
template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const float* wte,
                                         const float* wpe, int64_t rows, int T_, int C) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* e = wte + static_cast<int64_t>(tokens[row]) * C;
    const float* p = wpe + (row % T_) * C;
    T* o = out + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = from_f32<T>(e[c] + p[c]);
  }
}

template <typename T>
__global__ void embedding_backward_wte_kernel(float* dwte, const T* dout, const int32_t* tokens,
                                              int64_t rows, int C) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float* g = dwte + static_cast<int64_t>(tokens[row]) * C;
    const T* d = dout + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(g + c, to_f32(d[c]));
  }
}

// One thread per (t, c) of dwpe[T, C]: adds dout[b, t, c] for b = 0, 1, ... in order (the CPU's
// order, so fp32 is bitwise the CPU's).
template <typename T>
__global__ void embedding_backward_wpe_kernel(float* dwpe, const T* dout, int B, int64_t tc) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < tc;
       i += stride) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += to_f32(dout[b * tc + i]);
    dwpe[i] = acc;
  }
}

// ---- LayerNorm ---------------------------------------------------------------------------------

// One warp per row (grid-stride over rows): sum, then the centred sum of squares, then the output.
template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* in,
                                         const float* weight, const float* bias, int N, int C,
                                         float inv_c, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = blockDim.x >> 5;
  for (int64_t n = blockIdx.x * warps + (threadIdx.x >> 5); n < N; n += gridDim.x * warps) {
    const T* x = in + n * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += to_f32(x[c]);
    const float m = warp_reduce(sum, SumOp{}) * inv_c;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float d = to_f32(x[c]) - m;
      var += d * d;
    }
    const float s = 1.0f / sqrtf(warp_reduce(var, SumOp{}) * inv_c + eps);
    T* o = out + n * C;
    for (int c = lane; c < C; c += 32)
      o[c] = from_f32<T>((to_f32(x[c]) - m) * s * weight[c] + bias[c]);
    if (lane == 0) {
      mean[n] = m;
      rstd[n] = s;
    }
  }
}

// One warp per row: din += s (g - mean(g) - xhat mean(g xhat)), g = dout * weight.
template <typename T>
__global__ void layernorm_backward_input_kernel(T* din, const T* dout, const T* in,
                                                const float* weight, const float* mean,
                                                const float* rstd, int N, int C, float inv_c) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = blockDim.x >> 5;
  for (int64_t n = blockIdx.x * warps + (threadIdx.x >> 5); n < N; n += gridDim.x * warps) {
    const T* x = in + n * C;
    const T* dy = dout + n * C;
    T* dx = din + n * C;
    const float m = mean[n], s = rstd[n];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float xhat = (to_f32(x[c]) - m) * s;
      const float g = to_f32(dy[c]) * weight[c];
      sum_g += g;
      sum_gx += g * xhat;
    }
    const float mg = warp_reduce(sum_g, SumOp{}) * inv_c;
    const float mgx = warp_reduce(sum_gx, SumOp{}) * inv_c;
    for (int c = lane; c < C; c += 32) {
      const float xhat = (to_f32(x[c]) - m) * s;
      dx[c] = from_f32<T>(to_f32(dx[c]) + s * (to_f32(dy[c]) * weight[c] - mg - xhat * mgx));
    }
  }
}

// LayerNorm's backward in one pass over the rows for C <= kLnThreads * K: block b takes rows
// [b R, b R + R) (R = kLnRowsPerBlock) one after another, thread i holds columns i,
// i + kLnThreads, ... of every row (its weights, and its dweight and dbias partials in registers).
// Per row: the two row sums by block reductions, then din += ... . The block's partials go to
// part[0 or 1][b][C] (dweight's, then dbias's), added over the blocks in block order by
// column_finalize_kernel (below): a fixed order, as the column-sum form.
constexpr int kLnThreads = 256;
constexpr int kLnRowsPerBlock = 32;

template <typename T, int K>
__global__ void __launch_bounds__(kLnThreads)
    layernorm_backward_rows_kernel(T* din, float* part, const T* dout, const T* in,
                                   const float* weight, const float* mean, const float* rstd,
                                   int64_t N, int C, float inv_c) {
  __shared__ float buf[32];
  float w[K], dw[K], db[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = static_cast<int>(threadIdx.x) + k * kLnThreads;
    w[k] = c < C ? weight[c] : 0.0f;
    dw[k] = 0.0f;
    db[k] = 0.0f;
  }
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kLnRowsPerBlock;
  const int64_t r1 = min(N, r0 + kLnRowsPerBlock);
  for (int64_t r = r0; r < r1; ++r) {
    const float m = mean[r], s = rstd[r];
    float dy[K], xh[K];
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = static_cast<int>(threadIdx.x) + k * kLnThreads;
      dy[k] = 0.0f;
      xh[k] = 0.0f;
      if (c < C) {
        dy[k] = to_f32(dout[r * C + c]);
        xh[k] = (to_f32(in[r * C + c]) - m) * s;
        const float g = dy[k] * w[k];
        sum_g += g;
        sum_gx += g * xh[k];
        dw[k] += dy[k] * xh[k];
        db[k] += dy[k];
      }
    }
    const float mg = block_reduce(sum_g, SumOp{}, buf) * inv_c;
    const float mgx = block_reduce(sum_gx, SumOp{}, buf) * inv_c;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = static_cast<int>(threadIdx.x) + k * kLnThreads;
      if (c < C) {
        T* dx = din + r * C + c;
        *dx = from_f32<T>(to_f32(*dx) + s * (dy[k] * w[k] - mg - xh[k] * mgx));
      }
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = static_cast<int>(threadIdx.x) + k * kLnThreads;
    if (c < C) {
      part[static_cast<int64_t>(blockIdx.x) * C + c] = dw[k];
      part[(static_cast<int64_t>(gridDim.x) + blockIdx.x) * C + c] = db[k];
    }
  }
}

// ---- Column sums in a fixed order (bias and LayerNorm parameter gradients) --------------------
// The M rows are cut into R = column_chunks(M) chunks of `chunk` rows (the last ones may be
// empty). Block (x, y) of 32 x kColRows threads sums columns [32 x, 32 x + 32) over chunk y:
// thread (tx, ty) adds rows ty, ty + kColRows, ... of the chunk in order, then the kColRows
// partials of a column are added in ty order into part[k][y][c]. A second kernel adds the R
// partials of a column in chunk order and accumulates the total into the gradient.

constexpr int kColRows = 8;
constexpr int64_t kMaxChunks = 128;
constexpr int64_t kRowsPerChunk = 64;

int column_chunks(int64_t M) {
  return static_cast<int>(
      std::clamp<int64_t>((M + kRowsPerChunk - 1) / kRowsPerChunk, 1, kMaxChunks));
}

// values(r, c, v) writes the K values of element (r, c) that are summed.
template <int K, typename Values>
__global__ void column_partials_kernel(float* part, Values values, int64_t M, int N,
                                       int64_t chunk) {
  __shared__ float sh[K][kColRows][32];
  const int c = static_cast<int>(blockIdx.x) * 32 + static_cast<int>(threadIdx.x);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t r1 = min(M, r0 + chunk);
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.0f;
  if (c < N) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      float v[K];
      values(r, c, v);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) sh[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < N) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float s = sh[k][0][threadIdx.x];
      for (int y = 1; y < kColRows; ++y) s += sh[k][y][threadIdx.x];
      part[(static_cast<int64_t>(k) * gridDim.y + blockIdx.y) * N + c] = s;
    }
  }
}

// out[c] += part[0][c] + part[1][c] + ... + part[R-1][c]: one thread per column.
__global__ void column_finalize_kernel(float* out, const float* part, int R, int N) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < N;
       c += stride) {
    float s = 0.0f;
    for (int r = 0; r < R; ++r) s += part[static_cast<int64_t>(r) * N + c];
    out[c] += s;
  }
}

// outs[k][c] += sum over rows r of values(r, c)[k], k < K; scratch: K * column_chunks(M) * N.
template <int K, typename Values>
void column_sums(const char* name, float* const (&outs)[K], Values values, int64_t M, int N,
                 float* scratch, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return;
  const int R = column_chunks(M);
  const int64_t chunk = (M + R - 1) / R;
  const dim3 grid(static_cast<unsigned>((N + 31) / 32), static_cast<unsigned>(R));
  const dim3 block(32, kColRows);
  column_partials_kernel<K><<<grid, block, 0, stream>>>(scratch, values, M, N, chunk);
  check_launch(name);
  for (int k = 0; k < K; ++k) {
    column_finalize_kernel<<<blocks_for(N, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
        outs[k], scratch + static_cast<int64_t>(k) * R * N, R, N);
    check_launch("column_finalize");
  }
}

template <typename T>
struct BiasValues {
  const T* dout;
  int N;
  __device__ void operator()(int64_t r, int c, float* v) const { v[0] = to_f32(dout[r * N + c]); }
};

template <typename T>
struct LayernormParamValues {  // v[0] = dout * xhat (dweight), v[1] = dout (dbias)
  const T* dout;
  const T* in;
  const float* mean;
  const float* rstd;
  int C;
  __device__ void operator()(int64_t r, int c, float* v) const {
    const float dy = to_f32(dout[r * C + c]);
    const float xhat = (to_f32(in[r * C + c]) - mean[r]) * rstd[r];
    v[0] = dy * xhat;
    v[1] = dy;
  }
};

// ---- Residual and bias -------------------------------------------------------------------------

// Blocks over rows (grid-stride), threads across the N columns.
template <typename T>
__global__ void add_bias_kernel(T* out, const float* bias, int64_t M, int N) {
  for (int64_t r = blockIdx.x; r < M; r += gridDim.x) {
    T* o = out + r * N;
    for (int c = threadIdx.x; c < N; c += blockDim.x) o[c] = from_f32<T>(to_f32(o[c]) + bias[c]);
  }
}

// The bias fused into the pass that follows its product (one pass over [M, N] instead of two).
// out[i] = residual[i] + (in[i] + bias[i % N]) in fp32, one rounding. out may alias in or residual.
template <typename T>
__global__ void bias_residual_kernel(T* out, const T* in, const float* bias, const T* residual,
                                     int64_t n, int N) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_f32<T>(to_f32(residual[i]) + (to_f32(in[i]) + bias[i % N]));
}

// pre[i] = round(pre[i] + bias[i % N]) (kept: the backward's GELU input), out[i] = gelu(pre[i]).
template <typename T>
__global__ void gelu_bias_kernel(T* pre, T* out, const float* bias, int64_t n, int N) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const T x = from_f32<T>(to_f32(pre[i]) + bias[i % N]);
    pre[i] = x;
    out[i] = from_f32<T>(Gelu{}(to_f32(x)));
  }
}

// ---- Dropout -----------------------------------------------------------------------------------

// out[i] = in[i] * scale when philox_uniform(seed, stream, base + i) > p, else 0. out may alias in.
template <typename T>
__global__ void dropout_kernel(T* out, const T* in, int64_t n, float p, float scale, uint64_t seed,
                               uint64_t stream_id, uint64_t base) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const bool keep = philox_uniform(seed, stream_id, base + static_cast<uint64_t>(i)) > p;
    out[i] = from_f32<T>(keep ? to_f32(in[i]) * scale : 0.0f);
  }
}

float checked_dropout_scale(float p) {
  TESSERA_CHECK_AS(ConfigError, p >= 0.0f && p < 1.0f, "dropout probability ", p,
                   " is outside [0, 1)");
  return 1.0f / (1.0f - p);
}

template <typename T>
void dropout_rows(const char* name, T* out, const T* in, int64_t rows, int C, float p,
                  uint64_t seed, uint64_t stream_id, int64_t first_row, cudaStream_t stream) {
  const float scale = checked_dropout_scale(p);
  const int64_t n = rows * C;
  if (n <= 0) return;
  if (p == 0.0f) {
    if (out != in)
      check(cudaMemcpyAsync(out, in, sizeof(T) * static_cast<size_t>(n), cudaMemcpyDeviceToDevice,
                            stream),
            name);
    return;
  }
  const uint64_t base = static_cast<uint64_t>(first_row) * static_cast<uint64_t>(C);
  dropout_kernel<<<blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
      out, in, n, p, scale, seed, stream_id, base);
  check_launch(name);
}

// ---- Attention heads ---------------------------------------------------------------------------

// Element i of a [B, NH, T, hs] tensor: its index in a [B, T, width] tensor whose head h owns
// columns [h hs, (h+1) hs).
__device__ __forceinline__ int64_t btc_index(int64_t i, int T_, int NH, int hs, int64_t width) {
  const int64_t d = i % hs, r = i / hs;
  const int64_t t = r % T_, bh = r / T_;
  const int64_t h = bh % NH, b = bh / NH;
  return (b * T_ + t) * width + h * hs + d;
}

template <typename T>
__global__ void split_qkv_heads_kernel(T* q, T* k, T* v, const T* qkv, const float* bias, int64_t n,
                                       int T_, int NH, int hs) {
  const int64_t C = static_cast<int64_t>(NH) * hs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t src = btc_index(i, T_, NH, hs, 3 * C);
    if (bias == nullptr) {
      q[i] = qkv[src];
      k[i] = qkv[src + C];
      v[i] = qkv[src + 2 * C];
    } else {
      const int64_t c = src % (3 * C);  // the query column; keys and values C and 2C further
      q[i] = from_f32<T>(to_f32(qkv[src]) + bias[c]);
      k[i] = from_f32<T>(to_f32(qkv[src + C]) + bias[c + C]);
      v[i] = from_f32<T>(to_f32(qkv[src + 2 * C]) + bias[c + 2 * C]);
    }
  }
}

template <typename T>
__global__ void merge_qkv_heads_kernel(T* dqkv, const T* dq, const T* dk, const T* dv, int64_t n,
                                       int T_, int NH, int hs) {
  const int64_t C = static_cast<int64_t>(NH) * hs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t dst = btc_index(i, T_, NH, hs, 3 * C);
    dqkv[dst] = dq[i];
    dqkv[dst + C] = dk[i];
    dqkv[dst + 2 * C] = dv[i];
  }
}

// kToHeads: y[B, NH, T, hs] = x[B, T, C]; else x = y (the heads concatenated).
template <typename T, bool kToHeads>
__global__ void heads_kernel(T* dst, const T* src, int64_t n, int T_, int NH, int hs) {
  const int64_t C = static_cast<int64_t>(NH) * hs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t j = btc_index(i, T_, NH, hs, C);
    if constexpr (kToHeads) {
      dst[i] = src[j];
    } else {
      dst[j] = src[i];
    }
  }
}

// ---- Causal softmax ----------------------------------------------------------------------------

struct DropArgs {
  float p;           // 0: no dropout
  float keep_scale;  // 1 / (1 - p)
  uint64_t seed, stream;
  int64_t first_sample;
};

// The Philox index of element (row, 0) of a [B*NH*T, T] probability row, row = (b NH + h) T + t:
// (((first_sample + b) NH + h) T + t) T = ((first_sample NH + row / T) T + t) T.
__device__ __forceinline__ uint64_t attn_drop_base(int64_t row, int T_, int NH,
                                                   int64_t first_sample) {
  const int64_t t = row % T_, bh = row / T_;
  return ((static_cast<uint64_t>(first_sample) * NH + static_cast<uint64_t>(bh)) * T_ +
          static_cast<uint64_t>(t)) *
         static_cast<uint64_t>(T_);
}

// One block per row (grid-stride over the B*NH*T rows): max and sum over j <= t by block
// reductions, then the row written whole (zeros for j > t). att may alias scores: every read of a
// row's scores precedes the reductions' barriers, and the last pass reads element j before the
// same thread writes it.
template <typename T>
__global__ void causal_softmax_forward_kernel(T* att, T* att_drop, const T* scores, int64_t rows,
                                              int T_, int NH, float scale, DropArgs drop) {
  __shared__ float buf[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int t = static_cast<int>(row % T_);
    const T* s = scores + row * T_;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) mx = fmaxf(mx, scale * to_f32(s[j]));
    mx = block_reduce(mx, MaxOp{}, buf);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) sum += expf(scale * to_f32(s[j]) - mx);
    const float inv = 1.0f / block_reduce(sum, SumOp{}, buf);
    const uint64_t base = attn_drop_base(row, T_, NH, drop.first_sample);
    T* a = att + row * T_;
    T* ad = drop.p > 0.0f ? att_drop + row * T_ : nullptr;
    for (int j = threadIdx.x; j < T_; j += blockDim.x) {
      const float prob = j <= t ? expf(scale * to_f32(s[j]) - mx) * inv : 0.0f;
      a[j] = from_f32<T>(prob);
      if (ad != nullptr) {
        const bool keep = j <= t && philox_uniform(drop.seed, drop.stream, base + j) > drop.p;
        ad[j] = from_f32<T>(keep ? prob * drop.keep_scale : 0.0f);
      }
    }
  }
}

// One block per row: dot = sum_{j<=t} att g, then dscores = scale att (g - dot), 0 for j > t,
// with g = datt * keep / (1 - p) (the mask redrawn). dscores may alias datt (read, then written by
// the same thread after the reduction's barriers).
template <typename T>
__global__ void causal_softmax_backward_kernel(T* dscores, const T* datt, const T* att,
                                               int64_t rows, int T_, int NH, float scale,
                                               DropArgs drop) {
  __shared__ float buf[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int t = static_cast<int>(row % T_);
    const uint64_t base = attn_drop_base(row, T_, NH, drop.first_sample);
    const T* g = datt + row * T_;
    const T* a = att + row * T_;
    float dot = 0.0f;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) {
      float gj = to_f32(g[j]);
      if (drop.p > 0.0f)
        gj =
            philox_uniform(drop.seed, drop.stream, base + j) > drop.p ? gj * drop.keep_scale : 0.0f;
      dot += to_f32(a[j]) * gj;
    }
    dot = block_reduce(dot, SumOp{}, buf);
    T* ds = dscores + row * T_;
    for (int j = threadIdx.x; j < T_; j += blockDim.x) {
      float d = 0.0f;
      if (j <= t) {
        float gj = to_f32(g[j]);
        if (drop.p > 0.0f)
          gj = philox_uniform(drop.seed, drop.stream, base + j) > drop.p ? gj * drop.keep_scale
                                                                         : 0.0f;
        d = scale * to_f32(a[j]) * (gj - dot);
      }
      ds[j] = from_f32<T>(d);
    }
  }
}

// Register-resident forms of the two kernels above for rows of up to kSoftmaxThreads * K
// elements: thread i holds columns i, i + blockDim.x, ... of its row, so the row is read once and
// written once (the three-pass forms read it three times). Same arithmetic, same order of the
// block reductions, same results.
constexpr int kSoftmaxThreads = 256;

template <typename T, int K>
__global__ void __launch_bounds__(kSoftmaxThreads)
    causal_softmax_forward_regs_kernel(T* att, T* att_drop, const T* scores, int64_t rows, int T_,
                                       int NH, float scale, DropArgs drop) {
  __shared__ float buf[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int t = static_cast<int>(row % T_);
    const T* s = scores + row * T_;
    float v[K];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = static_cast<int>(threadIdx.x) + k * kSoftmaxThreads;
      v[k] = j <= t ? scale * to_f32(s[j]) : -INFINITY;
      mx = fmaxf(mx, v[k]);
    }
    mx = block_reduce(mx, MaxOp{}, buf);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = static_cast<int>(threadIdx.x) + k * kSoftmaxThreads;
      v[k] = j <= t ? expf(v[k] - mx) : 0.0f;
      sum += v[k];
    }
    const float inv = 1.0f / block_reduce(sum, SumOp{}, buf);
    const uint64_t base = attn_drop_base(row, T_, NH, drop.first_sample);
    T* a = att + row * T_;
    T* ad = drop.p > 0.0f ? att_drop + row * T_ : nullptr;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = static_cast<int>(threadIdx.x) + k * kSoftmaxThreads;
      if (j >= T_) break;
      const float prob = v[k] * inv;  // 0 above the diagonal
      a[j] = from_f32<T>(prob);
      if (ad != nullptr) {
        const bool keep = j <= t && philox_uniform(drop.seed, drop.stream, base + j) > drop.p;
        ad[j] = from_f32<T>(keep ? prob * drop.keep_scale : 0.0f);
      }
    }
  }
}

template <typename T, int K>
__global__ void __launch_bounds__(kSoftmaxThreads)
    causal_softmax_backward_regs_kernel(T* dscores, const T* datt, const T* att, int64_t rows,
                                        int T_, int NH, float scale, DropArgs drop) {
  __shared__ float buf[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int t = static_cast<int>(row % T_);
    const uint64_t base = attn_drop_base(row, T_, NH, drop.first_sample);
    const T* g = datt + row * T_;
    const T* a = att + row * T_;
    float gv[K], av[K];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = static_cast<int>(threadIdx.x) + k * kSoftmaxThreads;
      gv[k] = 0.0f;
      av[k] = 0.0f;
      if (j <= t) {
        float gj = to_f32(g[j]);
        if (drop.p > 0.0f)
          gj = philox_uniform(drop.seed, drop.stream, base + j) > drop.p ? gj * drop.keep_scale
                                                                         : 0.0f;
        gv[k] = gj;
        av[k] = to_f32(a[j]);
        dot += av[k] * gj;
      }
    }
    dot = block_reduce(dot, SumOp{}, buf);
    T* ds = dscores + row * T_;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = static_cast<int>(threadIdx.x) + k * kSoftmaxThreads;
      if (j >= T_) break;
      ds[j] = from_f32<T>(j <= t ? scale * av[k] * (gv[k] - dot) : 0.0f);
    }
  }
}

DropArgs drop_args(const AttnDropout& d) {
  const float keep_scale = checked_dropout_scale(d.p);
  return DropArgs{d.p, keep_scale, d.seed, d.stream_id, d.first_sample};
}

// ---- Cross-entropy -----------------------------------------------------------------------------

// One block per row (grid-stride over rows): each thread keeps a running (max, sum of exp) over
// its columns, the block combines them (max first, then the sums rescaled to it), loss = lse -
// logit[target]. kGrad: grad row = (softmax - onehot) * scale (grad may alias logits: the target
// logit is read before the first barrier, every other element by the thread that overwrites it).
template <typename T, bool kGrad>
__global__ void softmax_xent_kernel(T* grad, float* losses, const T* logits, const int32_t* targets,
                                    float scale, int N, int V, int64_t ld) {
  __shared__ float buf[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int32_t tgt = targets[n];
    if (tgt < 0) {  // the same for the whole block
      if constexpr (kGrad) {
        T* d = grad + n * ld;
        for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = from_f32<T>(0.0f);
      }
      if (threadIdx.x == 0) losses[n] = 0.0f;
      continue;
    }
    const T* x = logits + n * ld;
    const float x_tgt = threadIdx.x == 0 ? to_f32(x[tgt]) : 0.0f;
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float v = to_f32(x[j]);
      if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
      } else {
        s += expf(v - m);
      }
    }
    const float mx = block_reduce(m, MaxOp{}, buf);
    const float sum = block_reduce(m == -INFINITY ? 0.0f : s * expf(m - mx), SumOp{}, buf);
    const float lse = mx + logf(sum);
    if (threadIdx.x == 0) losses[n] = lse - x_tgt;
    if constexpr (kGrad) {
      T* d = grad + n * ld;
      for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = expf(to_f32(x[j]) - lse) * scale;
        if (j == tgt) g -= scale;
        d[j] = from_f32<T>(g);
      }
    }
  }
}

constexpr int kXentThreads = 512;

// ---- AdamW -------------------------------------------------------------------------------------

struct AdamwConsts {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, c1, c2, decay;
};

// One thread per element of the flat buffer (grid-stride); the element's segment by binary search
// over begin[]. The arithmetic is optim::adamw_update's, operation by operation, with explicit
// round-to-nearest intrinsics so that nothing is fused into an FMA.
__global__ void adamw_kernel(float* param, float* m, float* v, const float* grad,
                             const int64_t* begin, const int64_t* length, const uint8_t* decay,
                             int segments, int64_t n, AdamwConsts k) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int lo = 0, hi = segments;  // the first segment that begins after i
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (begin[mid] <= i) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const int seg = lo - 1;
    if (seg < 0 || i >= begin[seg] + length[seg]) continue;  // padding
    const float dec = decay[seg] != 0 ? k.decay : 1.0f;
    const float g = grad[i];
    const float mi = __fadd_rn(__fmul_rn(k.beta1, m[i]), __fmul_rn(k.one_minus_beta1, g));
    const float vi =
        __fadd_rn(__fmul_rn(k.beta2, v[i]), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
    m[i] = mi;
    v[i] = vi;
    const float num = __fmul_rn(k.lr, __fmul_rn(mi, k.c1));
    const float den = __fadd_rn(__fsqrt_rn(__fmul_rn(vi, k.c2)), k.eps);
    param[i] = __fsub_rn(__fmul_rn(param[i], dec), __fdiv_rn(num, den));
  }
}

// ---- Sums in double ----------------------------------------------------------------------------

constexpr int kSumThreads = 256;
constexpr int64_t kMaxSumBlocks = 1024;

int sum_blocks(int64_t n) {
  return blocks_for(std::max<int64_t>(n, 1), int64_t{kSumThreads} * 16, kMaxSumBlocks);
}

// part[block] = the block's sum (grid-stride, fixed grid: the assignment depends on n only).
template <bool kSquares>
__global__ void sum_partials_kernel(double* part, const float* x, int64_t n) {
  __shared__ double buf[32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double acc = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const double v = x[i];
    acc += kSquares ? v * v : v;
  }
  acc = block_reduce(acc, SumOp{}, buf);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

__global__ void sum_finalize_kernel(double* out, const double* part, int blocks) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    double s = 0.0;
    for (int b = 0; b < blocks; ++b) s += part[b];
    *out = s;
  }
}

template <bool kSquares>
double reduce_to_host(const char* name, const float* x, int64_t n, double* scratch,
                      cudaStream_t stream) {
  if (n <= 0) return 0.0;
  const int blocks = sum_blocks(n);
  sum_partials_kernel<kSquares><<<blocks, kSumThreads, 0, stream>>>(scratch, x, n);
  check_launch(name);
  sum_finalize_kernel<<<1, 32, 0, stream>>>(scratch + blocks, scratch, blocks);
  check_launch("sum_finalize");
  double result = 0.0;
  check(cudaMemcpyAsync(&result, scratch + blocks, sizeof(double), cudaMemcpyDeviceToHost, stream),
        "copy of a sum to the host");
  check(cudaStreamSynchronize(stream), "stream synchronize after a sum");
  return result;
}

}  // namespace

// ---- Conversions and fills ---------------------------------------------------------------------

void convert(bf16* out, const float* in, int64_t n, cudaStream_t stream) {
  map1("convert_f32_to_bf16", out, in, n, Identity{}, stream);
}

void convert(float* out, const bf16* in, int64_t n, cudaStream_t stream) {
  map1("convert_bf16_to_f32", out, in, n, Identity{}, stream);
}

void scale(float* x, int64_t n, float s, cudaStream_t stream) {
  map1("scale", x, x, n, Scale{s}, stream);
}

// ---- Embedding ---------------------------------------------------------------------------------

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T_, int C, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(B) * T_;
  if (rows <= 0 || C <= 0) return;
  embedding_forward_kernel<<<blocks_for(rows, 1, kMaxRowBlocks), kThreads, 0, stream>>>(
      out, tokens, wte, wpe, rows, T_, C);
  check_launch("embedding_forward");
}

template <typename T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, int B,
                        int T_, int C, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(B) * T_;
  if (rows <= 0 || C <= 0) return;
  if (dwte != nullptr) {
    embedding_backward_wte_kernel<<<blocks_for(rows, 1, kMaxRowBlocks), kThreads, 0, stream>>>(
        dwte, dout, tokens, rows, C);
    check_launch("embedding_backward_wte");
  }
  if (dwpe != nullptr) {
    const int64_t tc = static_cast<int64_t>(T_) * C;
    embedding_backward_wpe_kernel<<<blocks_for(tc, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
        dwpe, dout, B, tc);
    check_launch("embedding_backward_wpe");
  }
}

// ---- LayerNorm ---------------------------------------------------------------------------------

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* in, const float* weight,
                       const float* bias, int N, int C, float eps, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const int warps = kThreads / 32;
  layernorm_forward_kernel<<<blocks_for(N, warps, kMaxRowBlocks), kThreads, 0, stream>>>(
      out, mean, rstd, in, weight, bias, N, C, 1.0f / static_cast<float>(C), eps);
  check_launch("layernorm_forward");
}

int64_t layernorm_backward_scratch(int N, int C) {
  const int64_t row_blocks = (std::max(N, 0) + kLnRowsPerBlock - 1) / kLnRowsPerBlock;
  return 2 * std::max<int64_t>(column_chunks(N), row_blocks) * std::max(C, 0);
}

template <typename T>
void layernorm_backward(T* din, float* dweight, float* dbias, const T* dout, const T* in,
                        const float* weight, const float* mean, const float* rstd, int N, int C,
                        float* scratch, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (C <= 8 * kLnThreads) {
    const int blocks = static_cast<int>((int64_t{N} + kLnRowsPerBlock - 1) / kLnRowsPerBlock);
    const float inv_c = 1.0f / static_cast<float>(C);
    if (C <= 4 * kLnThreads)
      layernorm_backward_rows_kernel<T, 4><<<blocks, kLnThreads, 0, stream>>>(
          din, scratch, dout, in, weight, mean, rstd, N, C, inv_c);
    else
      layernorm_backward_rows_kernel<T, 8><<<blocks, kLnThreads, 0, stream>>>(
          din, scratch, dout, in, weight, mean, rstd, N, C, inv_c);
    check_launch("layernorm_backward_rows");
    float* const outs[2] = {dweight, dbias};
    for (int k = 0; k < 2; ++k) {
      column_finalize_kernel<<<blocks_for(C, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
          outs[k], scratch + static_cast<int64_t>(k) * blocks * C, blocks, C);
      check_launch("layernorm_backward_finalize");
    }
    return;
  }
  // The parameter gradients first: they read dout and in before din is written (in case a caller
  // ever passes din aliasing one of them).
  float* const outs[2] = {dweight, dbias};
  column_sums<2>("layernorm_backward_params", outs,
                 LayernormParamValues<T>{dout, in, mean, rstd, C}, N, C, scratch, stream);
  const int warps = kThreads / 32;
  layernorm_backward_input_kernel<<<blocks_for(N, warps, kMaxRowBlocks), kThreads, 0, stream>>>(
      din, dout, in, weight, mean, rstd, N, C, 1.0f / static_cast<float>(C));
  check_launch("layernorm_backward_input");
}

// ---- GELU --------------------------------------------------------------------------------------

template <typename T>
void gelu_forward(T* out, const T* in, int64_t n, cudaStream_t stream) {
  map1("gelu_forward", out, in, n, Gelu{}, stream);
}

template <typename T>
void gelu_backward(T* din, const T* dout, const T* in, int64_t n, cudaStream_t stream) {
  map2("gelu_backward", din, dout, in, n, GeluBackward{}, stream);
}

// ---- Residual and bias -------------------------------------------------------------------------

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream) {
  map2("residual_forward", out, a, b, n, Add{}, stream);
}

template <typename T>
void bias_residual_forward(T* out, const T* in, const float* bias, const T* residual, int64_t M,
                           int N, cudaStream_t stream) {
  const int64_t n = M * N;
  if (n <= 0) return;
  bias_residual_kernel<<<blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
      out, in, bias, residual, n, N);
  check_launch("bias_residual_forward");
}

template <typename T>
void gelu_bias_forward(T* pre, T* out, const float* bias, int64_t M, int N, cudaStream_t stream) {
  const int64_t n = M * N;
  if (n <= 0) return;
  gelu_bias_kernel<<<blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream>>>(pre, out, bias, n,
                                                                                 N);
  check_launch("gelu_bias_forward");
}

template <typename T>
void accumulate(T* out, const T* in, int64_t n, cudaStream_t stream) {
  map2("accumulate", out, static_cast<const T*>(out), in, n, Add{}, stream);
}

template <typename T>
void add_bias(T* out, const float* bias, int64_t M, int N, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return;
  add_bias_kernel<<<blocks_for(M, 1, kMaxRowBlocks), kThreads, 0, stream>>>(out, bias, M, N);
  check_launch("add_bias");
}

int64_t column_sum_scratch(int64_t M, int N) {
  return static_cast<int64_t>(column_chunks(M)) * std::max(N, 0);
}

template <typename T>
void bias_backward(float* dbias, const T* dout, int64_t M, int N, float* scratch,
                   cudaStream_t stream) {
  float* const outs[1] = {dbias};
  column_sums<1>("bias_backward", outs, BiasValues<T>{dout, N}, M, N, scratch, stream);
}

// ---- Dropout -----------------------------------------------------------------------------------

template <typename T>
void dropout_forward(T* out, const T* in, int64_t rows, int C, float p, uint64_t seed,
                     uint64_t stream_id, int64_t first_row, cudaStream_t stream) {
  dropout_rows("dropout_forward", out, in, rows, C, p, seed, stream_id, first_row, stream);
}

template <typename T>
void dropout_backward(T* din, const T* dout, int64_t rows, int C, float p, uint64_t seed,
                      uint64_t stream_id, int64_t first_row, cudaStream_t stream) {
  dropout_rows("dropout_backward", din, dout, rows, C, p, seed, stream_id, first_row, stream);
}

// ---- Attention heads ---------------------------------------------------------------------------

template <typename T>
void split_qkv_heads(T* q, T* k, T* v, const T* qkv, int B, int T_, int NH, int hs,
                     cudaStream_t stream, const float* bias) {
  const int64_t n = static_cast<int64_t>(B) * NH * T_ * hs;
  if (n <= 0) return;
  split_qkv_heads_kernel<<<blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
      q, k, v, qkv, bias, n, T_, NH, hs);
  check_launch("split_qkv_heads");
}

template <typename T>
void merge_qkv_heads(T* dqkv, const T* dq, const T* dk, const T* dv, int B, int T_, int NH, int hs,
                     cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(B) * NH * T_ * hs;
  if (n <= 0) return;
  merge_qkv_heads_kernel<<<blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
      dqkv, dq, dk, dv, n, T_, NH, hs);
  check_launch("merge_qkv_heads");
}

template <typename T>
void merge_heads(T* out, const T* y, int B, int T_, int NH, int hs, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(B) * NH * T_ * hs;
  if (n <= 0) return;
  heads_kernel<T, false>
      <<<blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream>>>(out, y, n, T_, NH, hs);
  check_launch("merge_heads");
}

template <typename T>
void split_heads(T* y, const T* x, int B, int T_, int NH, int hs, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(B) * NH * T_ * hs;
  if (n <= 0) return;
  heads_kernel<T, true>
      <<<blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream>>>(y, x, n, T_, NH, hs);
  check_launch("split_heads");
}

// ---- Causal softmax ----------------------------------------------------------------------------

template <typename T>
void causal_softmax_forward(T* att, T* att_drop, const T* scores, int B, int NH, int T_,
                            float scale, const AttnDropout& drop, cudaStream_t stream) {
  const DropArgs d = drop_args(drop);
  TESSERA_CHECK(d.p == 0.0f || att_drop != nullptr,
                "causal_softmax_forward: dropout needs an att_drop buffer");
  const int64_t rows = static_cast<int64_t>(B) * NH * T_;
  if (rows <= 0) return;
  const int blocks = blocks_for(rows, 1, kMaxRowBlocks);
  if (T_ <= 4 * kSoftmaxThreads) {
    causal_softmax_forward_regs_kernel<T, 4>
        <<<blocks, kSoftmaxThreads, 0, stream>>>(att, att_drop, scores, rows, T_, NH, scale, d);
  } else if (T_ <= 8 * kSoftmaxThreads) {
    causal_softmax_forward_regs_kernel<T, 8>
        <<<blocks, kSoftmaxThreads, 0, stream>>>(att, att_drop, scores, rows, T_, NH, scale, d);
  } else {
    causal_softmax_forward_kernel<<<blocks, row_threads(T_, 256), 0, stream>>>(
        att, att_drop, scores, rows, T_, NH, scale, d);
  }
  check_launch("causal_softmax_forward");
}

template <typename T>
void causal_softmax_backward(T* dscores, const T* datt, const T* att, int B, int NH, int T_,
                             float scale, const AttnDropout& drop, cudaStream_t stream) {
  const DropArgs d = drop_args(drop);
  const int64_t rows = static_cast<int64_t>(B) * NH * T_;
  if (rows <= 0) return;
  const int blocks = blocks_for(rows, 1, kMaxRowBlocks);
  if (T_ <= 4 * kSoftmaxThreads) {
    causal_softmax_backward_regs_kernel<T, 4>
        <<<blocks, kSoftmaxThreads, 0, stream>>>(dscores, datt, att, rows, T_, NH, scale, d);
  } else if (T_ <= 8 * kSoftmaxThreads) {
    causal_softmax_backward_regs_kernel<T, 8>
        <<<blocks, kSoftmaxThreads, 0, stream>>>(dscores, datt, att, rows, T_, NH, scale, d);
  } else {
    causal_softmax_backward_kernel<<<blocks, row_threads(T_, 256), 0, stream>>>(
        dscores, datt, att, rows, T_, NH, scale, d);
  }
  check_launch("causal_softmax_backward");
}

// ---- Loss --------------------------------------------------------------------------------------

template <typename T>
void softmax_xent_forward_backward(T* logits, float* losses, const int32_t* targets, float scale,
                                   int N, int V, cudaStream_t stream, int ld) {
  if (N <= 0 || V <= 0) return;
  softmax_xent_kernel<T, true>
      <<<blocks_for(N, 1, kMaxRowBlocks), row_threads(V, kXentThreads), 0, stream>>>(
          logits, losses, logits, targets, scale, N, V, ld > 0 ? ld : V);
  check_launch("softmax_xent_forward_backward");
}

template <typename T>
void softmax_xent_forward(float* losses, const T* logits, const int32_t* targets, int N, int V,
                          cudaStream_t stream, int ld) {
  if (N <= 0 || V <= 0) return;
  softmax_xent_kernel<T, false>
      <<<blocks_for(N, 1, kMaxRowBlocks), row_threads(V, kXentThreads), 0, stream>>>(
          nullptr, losses, logits, targets, 0.0f, N, V, ld > 0 ? ld : V);
  check_launch("softmax_xent_forward");
}

// ---- Optimizer ---------------------------------------------------------------------------------

void adamw_step(float* param, float* m, float* v, const float* grad, const int64_t* begin,
                const int64_t* length, const uint8_t* decay, int segments, int64_t flat_n,
                const AdamwArgs& a, cudaStream_t stream) {
  if (flat_n <= 0 || segments <= 0) return;
  // As optim::adamw_update, on the host in the same types.
  const float c1 = 1.0f / (1.0f - static_cast<float>(std::pow(a.beta1, static_cast<double>(a.t))));
  const float c2 = 1.0f / (1.0f - static_cast<float>(std::pow(a.beta2, static_cast<double>(a.t))));
  const AdamwConsts k{a.lr,
                      a.beta1,
                      a.beta2,
                      1.0f - a.beta1,
                      1.0f - a.beta2,
                      a.eps,
                      c1,
                      c2,
                      1.0f - a.lr * a.weight_decay};
  adamw_kernel<<<blocks_for(flat_n, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
      param, m, v, grad, begin, length, decay, segments, flat_n, k);
  check_launch("adamw_step");
}

// ---- Reductions --------------------------------------------------------------------------------

int64_t sum_squares_scratch(int64_t n) {
  return sum_blocks(n) + 1;
}

double sum_squares(const float* x, int64_t n, double* scratch, cudaStream_t stream) {
  return reduce_to_host<true>("sum_squares", x, n, scratch, stream);
}

double sum(const float* x, int64_t n, double* scratch, cudaStream_t stream) {
  return reduce_to_host<false>("sum", x, n, scratch, stream);
}

// ---- Instantiations ----------------------------------------------------------------------------

#define TESSERA_CUDA_INSTANTIATE(T)                                                                \
  template void embedding_forward<T>(T*, const int32_t*, const float*, const float*, int, int,     \
                                     int, cudaStream_t);                                           \
  template void embedding_backward<T>(float*, float*, const T*, const int32_t*, int, int, int,     \
                                      cudaStream_t);                                               \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const float*, const float*,     \
                                     int, int, float, cudaStream_t);                               \
  template void layernorm_backward<T>(T*, float*, float*, const T*, const T*, const float*,        \
                                      const float*, const float*, int, int, float*, cudaStream_t); \
  template void gelu_forward<T>(T*, const T*, int64_t, cudaStream_t);                              \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t, cudaStream_t);                   \
  template void residual_forward<T>(T*, const T*, const T*, int64_t, cudaStream_t);                \
  template void accumulate<T>(T*, const T*, int64_t, cudaStream_t);                                \
  template void bias_residual_forward<T>(T*, const T*, const float*, const T*, int64_t, int,       \
                                         cudaStream_t);                                            \
  template void gelu_bias_forward<T>(T*, T*, const float*, int64_t, int, cudaStream_t);            \
  template void add_bias<T>(T*, const float*, int64_t, int, cudaStream_t);                         \
  template void bias_backward<T>(float*, const T*, int64_t, int, float*, cudaStream_t);            \
  template void dropout_forward<T>(T*, const T*, int64_t, int, float, uint64_t, uint64_t, int64_t, \
                                   cudaStream_t);                                                  \
  template void dropout_backward<T>(T*, const T*, int64_t, int, float, uint64_t, uint64_t,         \
                                    int64_t, cudaStream_t);                                        \
  template void split_qkv_heads<T>(T*, T*, T*, const T*, int, int, int, int, cudaStream_t,         \
                                   const float*);                                                  \
  template void merge_qkv_heads<T>(T*, const T*, const T*, const T*, int, int, int, int,           \
                                   cudaStream_t);                                                  \
  template void merge_heads<T>(T*, const T*, int, int, int, int, cudaStream_t);                    \
  template void split_heads<T>(T*, const T*, int, int, int, int, cudaStream_t);                    \
  template void causal_softmax_forward<T>(T*, T*, const T*, int, int, int, float,                  \
                                          const AttnDropout&, cudaStream_t);                       \
  template void causal_softmax_backward<T>(T*, const T*, const T*, int, int, int, float,           \
                                           const AttnDropout&, cudaStream_t);                      \
  template void softmax_xent_forward_backward<T>(T*, float*, const int32_t*, float, int, int,      \
                                                 cudaStream_t, int);                               \
  template void softmax_xent_forward<T>(float*, const T*, const int32_t*, int, int, cudaStream_t,  \
                                        int);

TESSERA_CUDA_INSTANTIATE(float)
TESSERA_CUDA_INSTANTIATE(bf16)

#undef TESSERA_CUDA_INSTANTIATE

}  // namespace tessera::cuda
