// oneDNN's bf16 matmul (oneDNN picks AVX512-BF16 or AMX kernels at run time).
#include "tessera/kernels/gemm_onednn.h"

#include <cblas.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "tessera/kernels/bf16.h"
#include "tessera/kernels/precision.h"

namespace tessera::kernels {

bool onednn_built() {
  return true;
}

namespace {

struct Shape {
  bool trans_a, trans_b;
  int M, N, K, ldc;
  float alpha, beta;
  bool operator==(const Shape&) const = default;
};

struct ShapeHash {
  size_t operator()(const Shape& s) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(s.trans_a), mix(s.trans_b), mix(static_cast<uint32_t>(s.M));
    mix(static_cast<uint32_t>(s.N)), mix(static_cast<uint32_t>(s.K));
    mix(static_cast<uint32_t>(s.ldc));
    uint32_t a, b;
    std::memcpy(&a, &s.alpha, 4), std::memcpy(&b, &s.beta, 4);
    mix(a), mix(b);
    return static_cast<size_t>(h);
  }
};

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

struct Primitive {
  dnnl::memory::desc a, b, c;
  dnnl::matmul matmul;
};

// One engine, stream, primitive cache and pair of bf16 buffers per thread (ranks are threads).
struct ThreadState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<Shape, Primitive, ShapeHash> primitives;
  std::vector<uint16_t> a, b;
};
thread_local std::unique_ptr<ThreadState> state;

// op(A) [M, K] from a dense bf16 copy of A as stored ([M, K], or [K, M] when transposed).
dnnl::memory::desc operand(int rows, int cols, bool transposed, dt type) {
  // dims are those of op(X) = [rows, cols]; the copy is dense in X's stored layout.
  return transposed ? dnnl::memory::desc(dims{rows, cols}, type, dims{1, rows})
                    : dnnl::memory::desc(dims{rows, cols}, type, dims{cols, 1});
}

Primitive make_primitive(ThreadState& st, const Shape& s) {
  const auto a = operand(s.M, s.K, s.trans_a, dt::bf16);
  const auto b = operand(s.K, s.N, s.trans_b, dt::bf16);
  const dnnl::memory::desc c(dims{s.M, s.N}, dt::f32, dims{s.ldc, 1});
  dnnl::primitive_attr attr;
  if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});
  if (s.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(s.beta);  // C = alpha (A . B) + beta C
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, st.engine);
  return Primitive{a, b, c, dnnl::matmul(pd)};
}

// X [rows, cols] with leading dimension ld as dense bf16: fp32 converted into buf; bf16 read
// where it is when already dense, else copied row by row into buf.
const uint16_t* dense_bf16(std::vector<uint16_t>& buf, GemmInput x, int rows, int cols, int ld) {
  if (x.bf16 != nullptr && ld == cols) return x.bf16;
  buf.resize(static_cast<size_t>(rows) * cols);
  if (x.bf16 == nullptr) {
    f32_to_bf16_rows(buf.data(), x.f32, rows, cols, ld);
  } else {
    for (int r = 0; r < rows; ++r)
      std::memcpy(buf.data() + static_cast<size_t>(r) * cols, x.bf16 + static_cast<size_t>(r) * ld,
                  sizeof(uint16_t) * static_cast<size_t>(cols));
  }
  return buf.data();
}

}  // namespace

void gemm_bf16_onednn(bool trans_a, bool trans_b, int M, int N, int K, float alpha, GemmInput A,
                      int lda, GemmInput B, int ldb, float beta, float* C, int ldc) {
  if (!state) state = std::make_unique<ThreadState>();
  ThreadState& st = *state;
  // As many OpenMP threads as OpenBLAS was given (train::set_compute_threads): ranks that are
  // threads then share the cores as they do under OpenBLAS. The setting is per calling thread.
  omp_set_num_threads(openblas_get_num_threads());

  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const uint16_t* a = dense_bf16(st.a, A, a_rows, a_cols, lda);
  const uint16_t* b = dense_bf16(st.b, B, b_rows, b_cols, ldb);

  const Shape shape{trans_a, trans_b, M, N, K, ldc, alpha, beta};
  auto it = st.primitives.find(shape);
  if (it == st.primitives.end()) it = st.primitives.emplace(shape, make_primitive(st, shape)).first;
  const Primitive& p = it->second;
  // oneDNN takes a non-const handle; a matmul only reads its sources.
  dnnl::memory ma(p.a, st.engine, const_cast<uint16_t*>(a));
  dnnl::memory mb(p.b, st.engine, const_cast<uint16_t*>(b));
  dnnl::memory mc(p.c, st.engine, C);
  p.matmul.execute(st.stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  st.stream.wait();
}

}  // namespace tessera::kernels
