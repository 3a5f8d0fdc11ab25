// Each GPU operation of a GPT-2 124M step (B=16, T=1024, bf16) timed alone: the products through
// cuBLAS as the model calls them (cublasGemmEx, CUBLAS_GEMM_DEFAULT) beside the best of
// cuBLASLt's heuristic candidates for the same problem, and the model's own kernels, each with its
// rate (TFLOP/s for products, GB/s of the fewest bytes it must move for the rest). The median of
// 20 timed runs after 3 warm-up runs, with CUDA events; inputs random, never zeros.
//
//   kernel_speed [--tokens 16384] [--width 768] [--vocab 50257] [--heads 12] [--seq 1024]
#include <cublasLt.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tessera/cuda/gemm.h"
#include "tessera/cuda/kernels.h"
#include "tessera/cuda/runtime.h"

namespace {

using namespace tessera;
using namespace tessera::cuda;

// Median milliseconds of fn over `reps` runs on `s`.
double time_ms(cudaStream_t s, const std::function<void()>& fn, int reps = 20) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a, s), "cudaEventRecord");
    fn();
    check(cudaEventRecord(b, s), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    t.push_back(ms);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename T>
T* random_device(DeviceAllocator& alloc, int64_t n, cudaStream_t s, float scale = 1.0f) {
  std::vector<float> h(static_cast<size_t>(n));
  std::mt19937 rng(static_cast<uint32_t>(n));
  std::normal_distribution<float> d(0.0f, scale);
  for (float& x : h) x = d(rng);
  float* f = static_cast<float*>(alloc.allocate(sizeof(float) * h.size(), MemCategory::Other, "f"));
  copy_to_device(f, h.data(), sizeof(float) * h.size(), s);
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else {
    T* out = static_cast<T*>(alloc.allocate(sizeof(T) * h.size(), MemCategory::Other, "b"));
    convert(out, f, n, s);
    return out;
  }
}

// The best of cuBLASLt's heuristic candidates (up to 16, each timed) for row-major
// C[M,N] = op(A) op(B) (the same column-major swap as cuda::gemm), beta as given.
double best_lt_ms(cublasLtHandle_t lt, cudaStream_t s, bool ta, bool tb, int M, int N, int K,
                  const bf16* A, int lda, const bf16* B, int ldb, void* C, cudaDataType ct, int ldc,
                  float beta, void* ws, size_t ws_bytes, int* candidates) {
  cublasLtMatmulDesc_t desc;
  check_cublas(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                          opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
               "transa");
  check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
               "transb");
  cublasLtMatrixLayout_t la, lb, lc;
  // First operand: row-major B; second: row-major A; output C^T [N, M].
  check_cublas(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, tb ? K : N, tb ? N : K, ldb), "la");
  check_cublas(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, ta ? M : K, ta ? K : M, lda), "lb");
  check_cublas(cublasLtMatrixLayoutCreate(&lc, ct, N, M, ldc), "lc");
  cublasLtMatmulPreference_t pref;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), "pref");
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws_bytes, sizeof ws_bytes),
               "workspace");
  cublasLtMatmulHeuristicResult_t res[16];
  int found = 0;
  check_cublas(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 16, res, &found),
               "heuristic");
  *candidates = found;
  const float alpha = 1.0f;
  double best = 1e30;
  for (int i = 0; i < found; ++i) {
    const double ms = time_ms(
        s,
        [&] {
          check_cublas(cublasLtMatmul(lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc,
                                      &res[i].algo, ws, ws_bytes, s),
                       "cublasLtMatmul");
        },
        10);
    best = std::min(best, ms);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Each GPU operation of a GPT-2 step, timed alone"};
  int M = 16384, C = 768, V = 50257, NH = 12, T = 1024;
  app.add_option("--tokens", M, "rows (B x T)");
  app.add_option("--width", C, "model width");
  app.add_option("--vocab", V, "vocabulary");
  app.add_option("--heads", NH, "heads");
  app.add_option("--seq", T, "sequence length (attention)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!available()) {
      std::fprintf(stderr, "kernel_speed: no CUDA device\n");
      return 2;
    }
    Stream stream;
    const cudaStream_t s = stream.get();
    Blas blas(s);
    cublasLtHandle_t lt;
    check_cublas(cublasLtCreate(&lt), "cublasLtCreate");
    DeviceAllocator alloc("bench");
    const size_t ws_bytes = size_t{32} << 20;
    void* ws = alloc.allocate(ws_bytes, MemCategory::Buffers, "workspace");
    const int Vp = (V + 63) / 64 * 64;
    const int64_t big = std::max<int64_t>(int64_t{M} * Vp, int64_t{M} / T * NH * T * T);
    bf16* x = random_device<bf16>(alloc, big, s);
    bf16* y = random_device<bf16>(alloc, big, s);
    bf16* out16 = random_device<bf16>(alloc, big, s);
    float* out32 = random_device<float>(alloc, int64_t{Vp} * 4 * C, s);
    std::printf("%-40s %10s %10s %10s %4s\n", "product (row-major M x N x K)", "gemmEx ms",
                "best Lt ms", "TFLOP/s", "algs");
    struct Shape {
      const char* name;
      bool ta, tb;
      int m, n, k;
      bool f32_out;
    };
    const int F = 4 * C;
    const std::vector<Shape> shapes = {
        {"c_attn", false, false, M, 3 * C, C, false},
        {"attn.c_proj", false, false, M, C, C, false},
        {"c_fc", false, false, M, F, C, false},
        {"mlp.c_proj", false, false, M, C, F, false},
        {"lm head V", false, true, M, V, C, false},
        {"lm head Vp", false, true, M, Vp, C, false},
        {"c_attn din", false, true, M, C, 3 * C, false},
        {"c_fc din", false, true, M, C, F, false},
        {"mlp.c_proj din", false, true, M, F, C, false},
        {"c_attn dW (fp32 out)", true, false, C, 3 * C, M, true},
        {"c_fc dW (fp32 out)", true, false, C, F, M, true},
        {"mlp.c_proj dW (fp32 out)", true, false, F, C, M, true},
        {"lm head dlnf V", false, false, M, C, V, false},
        {"lm head dlnf Vp", false, false, M, C, Vp, false},
        {"lm head dwte (fp32 out)", true, false, V, C, M, true},
    };
    for (const Shape& sh : shapes) {
      const int lda = sh.ta ? sh.m : sh.k, ldb = sh.tb ? sh.k : sh.n, ldc = sh.n;
      const float beta = sh.f32_out ? 1.0f : 0.0f;
      const double ex = time_ms(s, [&] {
        if (sh.f32_out)
          gemm<bf16, float>(blas, sh.ta, sh.tb, sh.m, sh.n, sh.k, 1.0f, x, lda, y, ldb, beta, out32,
                            ldc);
        else
          gemm<bf16, bf16>(blas, sh.ta, sh.tb, sh.m, sh.n, sh.k, 1.0f, x, lda, y, ldb, beta, out16,
                           ldc);
      });
      int algs = 0;
      const double best =
          best_lt_ms(lt, s, sh.ta, sh.tb, sh.m, sh.n, sh.k, x, lda, y, ldb,
                     sh.f32_out ? static_cast<void*>(out32) : static_cast<void*>(out16),
                     sh.f32_out ? CUDA_R_32F : CUDA_R_16BF, ldc, beta, ws, ws_bytes, &algs);
      const double flop = 2.0 * sh.m * sh.n * sh.k;
      std::printf("%-24s %5dx%5dx%5d %10.3f %10.3f %10.0f %4d\n", sh.name, sh.m, sh.n, sh.k, ex,
                  best, flop / (std::min(ex, best) * 1e-3) / 1e12, algs);
    }
    // Attention's batched products and kernels at B = M / T sequences.
    const int B = M / T, hs = C / NH, BH = B * NH;
    const int64_t TT = int64_t{T} * T, THS = int64_t{T} * hs;
    auto row = [&](const char* name, double ms, double bytes, double flop = 0) {
      if (flop > 0)
        std::printf("%-40s %10.3f %21.0f TFLOP/s\n", name, ms, flop / (ms * 1e-3) / 1e12);
      else
        std::printf("%-40s %10.3f %21.0f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
    };
    const double bf = 2.0;  // bytes per bf16
    row("attention q k^T (batched)",
        time_ms(s,
                [&] {
                  gemm_batched<bf16, bf16>(blas, false, true, T, T, hs, 1.0f, x, hs, THS, y, hs,
                                           THS, 0.0f, out16, T, TT, BH);
                }),
        0, 2.0 * BH * TT * hs);
    row("attention p v (batched)",
        time_ms(s,
                [&] {
                  gemm_batched<bf16, bf16>(blas, false, false, T, hs, T, 1.0f, x, T, TT, y, hs, THS,
                                           0.0f, out16, hs, THS, BH);
                }),
        0, 2.0 * BH * TT * hs);
    row("attention p^T dy (batched)",
        time_ms(s,
                [&] {
                  gemm_batched<bf16, bf16>(blas, true, false, T, hs, T, 1.0f, x, T, TT, y, hs, THS,
                                           0.0f, out16, hs, THS, BH);
                }),
        0, 2.0 * BH * TT * hs);
    const AttnDropout nodrop{};
    const float scale = 0.125f;
    row("causal softmax forward",
        time_ms(
            s,
            [&] { causal_softmax_forward<bf16>(out16, nullptr, x, B, NH, T, scale, nodrop, s); }),
        2 * bf * BH * TT);
    row("causal softmax backward",
        time_ms(s, [&] { causal_softmax_backward(out16, y, x, B, NH, T, scale, nodrop, s); }),
        3 * bf * BH * TT);
    // Row kernels on [M, C] and [M, 4C].
    float* w = random_device<float>(alloc, 4 * C, s);
    float* b = random_device<float>(alloc, 4 * C, s);
    float* mean = random_device<float>(alloc, M, s);
    float* rstd = random_device<float>(alloc, M, s);
    float* dw = random_device<float>(alloc, 4 * C, s);
    float* db = random_device<float>(alloc, 4 * C, s);
    float* scratch = static_cast<float*>(alloc.allocate(
        sizeof(float) * std::max(layernorm_backward_scratch(M, C), column_sum_scratch(M, 4 * C)),
        MemCategory::Other, "scratch"));
    const double mc = double(M) * C;
    row("layernorm forward [M, C]",
        time_ms(s, [&] { layernorm_forward(out16, mean, rstd, x, w, b, M, C, 1e-5f, s); }),
        2 * bf * mc);
    row("layernorm backward [M, C]",
        time_ms(s,
                [&] { layernorm_backward(out16, dw, db, y, x, w, mean, rstd, M, C, scratch, s); }),
        4 * bf * mc);
    row("bias add [M, 3C]", time_ms(s, [&] { add_bias(out16, b, M, 3 * C, s); }), 2 * bf * 3 * mc);
    row("bias backward [M, 4C]", time_ms(s, [&] { bias_backward(db, y, M, 4 * C, scratch, s); }),
        bf * 4 * mc);
    row("gelu forward [M, 4C]", time_ms(s, [&] { gelu_forward(out16, x, int64_t(M) * 4 * C, s); }),
        2 * bf * 4 * mc);
    row("gelu backward [M, 4C]",
        time_ms(s, [&] { gelu_backward(out16, y, x, int64_t(M) * 4 * C, s); }), 3 * bf * 4 * mc);
    row("residual [M, C]", time_ms(s, [&] { residual_forward(out16, x, y, int64_t(M) * C, s); }),
        3 * bf * mc);
    row("split qkv heads [M, 3C]",
        time_ms(
            s,
            [&] { split_qkv_heads(out16, out16 + M * C, out16 + 2 * M * C, x, B, T, NH, hs, s); }),
        2 * bf * 3 * mc);
    std::vector<int32_t> tg(static_cast<size_t>(M));
    for (int i = 0; i < M; ++i) tg[static_cast<size_t>(i)] = (i * 7919) % V;
    int32_t* targets =
        static_cast<int32_t*>(alloc.allocate(sizeof(int32_t) * tg.size(), MemCategory::Other, "t"));
    copy_to_device(targets, tg.data(), sizeof(int32_t) * tg.size(), s);
    float* losses = random_device<float>(alloc, M, s);
    row("softmax cross-entropy fwd+bwd [M, V]",
        time_ms(s,
                [&] { softmax_xent_forward_backward(out16, losses, targets, 1e-4f, M, V, s, Vp); }),
        2 * bf * double(M) * V);
    const int64_t P = 124'475'904;
    float* p = random_device<float>(alloc, P, s, 0.02f);
    float* g = random_device<float>(alloc, P, s, 0.01f);
    float* m1 = random_device<float>(alloc, P, s, 0.01f);
    float* m2 = random_device<float>(alloc, P, s, 0.0f);
    check(cudaMemsetAsync(m2, 0, sizeof(float) * P, s), "memset");
    const std::vector<int64_t> hb{0}, hl{P};
    const std::vector<uint8_t> hd{1};
    int64_t* sb = static_cast<int64_t*>(alloc.allocate(8, MemCategory::Other, "sb"));
    int64_t* sl = static_cast<int64_t*>(alloc.allocate(8, MemCategory::Other, "sl"));
    uint8_t* sd = static_cast<uint8_t*>(alloc.allocate(1, MemCategory::Other, "sd"));
    copy_to_device(sb, hb.data(), 8, s);
    copy_to_device(sl, hl.data(), 8, s);
    copy_to_device(sd, hd.data(), 1, s);
    AdamwArgs a;
    a.lr = 1e-4f;
    row("adamw, 124M parameters",
        time_ms(s, [&] { adamw_step(p, m1, m2, g, sb, sl, sd, 1, P, a, s); }), 7 * 4.0 * P);
    cublasLtDestroy(lt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_speed: %s\n", e.what());
    return 1;
  }
  return 0;
}
