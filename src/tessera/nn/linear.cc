#include "tessera/nn/linear.h"

#include "tessera/core/error.h"
#include "tessera/kernels/bf16.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/residual.h"
#include "tessera/nn/kept_input.h"

namespace tessera::nn {

TpRegion branch_region(const TensorSplit& split, const BlockPass& mb, BlockWorkspace& ws,
                       int64_t width) {
  return TpRegion(split, mb.tokens(), width, ws.gathered.defined() ? ws.gathered.f32() : nullptr,
                  ws.proj.f32());
}

BranchDropout branch_dropout(const BlockPass& mb, const TpRegion& region, uint64_t site,
                             const Tensor& mask) {
  BranchDropout d;
  d.p = mb.p;
  d.seed = mb.seed;
  d.stream = mix_stream(mb.step, site);
  d.map = mb.row_map();
  d.first = region.rows.begin;
  d.mask = mask.defined() ? mask.data<uint8_t>() : nullptr;
  return d;
}

void BranchDropout::draw_mask(int64_t rows, int width) const {
  if (p > 0.0f) kernels::dropout_mask_rows(mask, rows, width, p, seed, stream, map, first);
}

namespace k = tessera::kernels;

TpRegion::TpRegion(const TensorSplit& s, int64_t n, int64_t w, float* g, float* p)
    : split(s), rows(token_range(s, n)), tokens(n), width(w), gathered(g), proj(p) {}

std::optional<Linear> fused(const ParameterSet& ps, std::initializer_list<const Linear*> layers) {
  const Linear& first = **layers.begin();
  Linear f = first;
  f.out = 0;
  const Linear* prev = nullptr;
  for (const Linear* l : layers) {
    if (!l->transposed || l->in != first.in || (l->bias >= 0) != (first.bias >= 0))
      return std::nullopt;
    if (prev) {
      const int64_t n = ps.infos()[prev->weight].local_numel();
      const k::GemmInput a = ps.gemm_weight(prev->weight), b = ps.gemm_weight(l->weight);
      const bool weights = ps.param_data(l->weight) == ps.param_data(prev->weight) + n &&
                           (ps.grad_data(prev->weight) == nullptr ||
                            ps.grad_data(l->weight) == ps.grad_data(prev->weight) + n) &&
                           (a.bf16 == nullptr || b.bf16 == a.bf16 + n);
      const bool biases =
          first.bias < 0 || (ps.param_data(l->bias) == ps.param_data(prev->bias) + prev->out &&
                             (ps.grad_data(prev->bias) == nullptr ||
                              ps.grad_data(l->bias) == ps.grad_data(prev->bias) + prev->out));
      if (!weights || !biases) return std::nullopt;
    }
    f.out += l->out;
    prev = l;
  }
  return f;
}

void linear_forward(const ParameterSet& ps, const Linear& l, float* y, int64_t ldy, k::GemmInput x,
                    int64_t tokens) {
  const float* bias = l.bias >= 0 ? ps.param_data(l.bias) : nullptr;
  const int M = static_cast<int>(tokens), K = static_cast<int>(l.in), N = static_cast<int>(l.out);
  if (!l.transposed) {
    TESSERA_ASSERT(ldy == l.out, "a Conv1D-layout linear writes contiguous rows");
    k::matmul_forward(y, x, ps.gemm_weight(l.weight), bias, nullptr, M, K, N);
    return;
  }
  k::gemm(false, true, M, N, K, 1.0f, x, K, ps.gemm_weight(l.weight), K, 0.0f, y,
          static_cast<int>(ldy));
  if (bias)
    for (int64_t r = 0; r < tokens; ++r)
      for (int64_t j = 0; j < l.out; ++j) y[r * ldy + j] += bias[j];
}

void linear_backward(const ParameterSet& ps, const Linear& l, float* dx, bool accumulate_dx,
                     float* dweight, float* dbias, const float* dy, int64_t lddy, k::GemmInput x,
                     int64_t tokens) {
  const int M = static_cast<int>(tokens), K = static_cast<int>(l.in), N = static_cast<int>(l.out);
  if (!l.transposed) {
    TESSERA_ASSERT(lddy == l.out, "a Conv1D-layout linear reads contiguous rows");
    k::matmul_backward(dx, dweight, dbias, dy, x, ps.gemm_weight(l.weight), M, K, N, accumulate_dx);
    return;
  }
  // Rounded once for both GEMMs when a bf16 GEMM would round it (each would, into its own scratch).
  const k::GemmInput g = dx && dweight ? k::output_gradient(dy, M, N, static_cast<int>(lddy)) : dy;
  const int ld = k::output_gradient_ld(g, N, static_cast<int>(lddy));
  if (dx)  // dx[M, K] = dy[M, N] W[N, K]
    k::gemm(false, false, M, K, N, 1.0f, g, ld, ps.gemm_weight(l.weight), K,
            accumulate_dx ? 1.0f : 0.0f, dx, K);
  if (dweight)  // dW[N, K] += dy^T x
    k::gemm(true, false, N, K, M, 1.0f, g, ld, x, K, 1.0f, dweight, K);
  if (dbias)
    for (int64_t r = 0; r < tokens; ++r)
      for (int64_t j = 0; j < l.out; ++j) dbias[j] += dy[r * lddy + j];
}

k::GemmInput enter_tp(const TpRegion& region, const float* x_rows, k::GemmInput kept) {
  if (!region.sequence()) return kept;  // copy_to_tp's forward is the identity
  return gather_to_tp(region.split, x_rows, region.gathered, region.rows, region.width);
}

void column_linear(const TpRegion& region, const ParameterSet& ps, const Linear& l, float* y,
                   const float* x_rows, k::GemmInput kept) {
  linear_forward(ps, l, y, l.out, enter_tp(region, x_rows, kept), region.tokens);
}

k::GemmInput column_linear_input(const TpRegion& region, const Tensor& rows) {
  if (!region.sequence()) return kept(rows);
  const int64_t C = region.width;
  float* place = region.gathered + region.rows.place() * C;
  if (rows.dtype() == DType::BF16)
    k::bf16_to_f32(place, rows.data<uint16_t>(), region.rows.size() * C);
  const float* slice = rows.dtype() == DType::BF16 ? place : rows.f32();
  return gather_to_tp(region.split, slice, region.gathered, region.rows, C);
}

float* column_linear_grad_input(const TpRegion& region, float* dx_tokens) {
  if (!region.sequence())
    return copy_to_tp_backward(region.split, dx_tokens, region.tokens * region.width);
  return gather_to_tp_backward(region.split, dx_tokens,
                               dx_tokens + region.rows.place() * region.width, region.rows,
                               region.width);
}

void residual_branch(const TpRegion& region, float* out, float* y, const float* bias,
                     const float* residual, const BranchDropout& drop) {
  const int64_t R = region.rows.size(), C = region.width, n = R * C;
  const bool dropping = drop.p > 0.0f;
  if (!dropping && bias) {
    k::bias_residual_forward(out, y, bias, residual, R, C);
    return;
  }
  if (bias) k::bias_forward(y, y, bias, R, C);
  if (!dropping) {
    k::residual_forward(out, residual, y, n);
    return;
  }
  k::dropout_forward_rows(y, drop.mask, y, R, static_cast<int>(C), drop.p, drop.seed, drop.stream,
                          drop.map, drop.first);
  k::residual_forward(out, residual, y, n);
}

void row_linear(const TpRegion& region, const ParameterSet& ps, const Linear& l, float* out,
                k::GemmInput x, const float* residual, const BranchDropout& drop) {
  const int64_t C = region.width;
  Linear without_bias = l;
  without_bias.bias = -1;  // added once, after the reduce
  linear_forward(ps, without_bias, region.proj, C, x, region.tokens);
  // The reduce point: the sum of the partial products, on this rank's rows.
  float* y = region.sequence()
                 ? reduce_scatter_from_tp(region.split, region.proj,
                                          region.proj + region.rows.place() * C, region.rows, C)
                 : reduce_from_tp(region.split, region.proj, region.tokens * C);
  residual_branch(region, out, y, l.bias >= 0 ? ps.param_data(l.bias) : nullptr, residual, drop);
}

const float* row_linear_grad_output(const TpRegion& region, const float* dres,
                                    const BranchDropout& drop) {
  const int64_t C = region.width;
  const float* dy = dres;
  if (drop.p > 0.0f) {
    float* dy_rows = region.proj + region.rows.place() * C;
    k::dropout_backward(dy_rows, dres, drop.mask, region.row_elems(), drop.p);
    dy = dy_rows;
  }
  // reduce_from_tp's backward is the identity: without sequence parallelism dy is complete on
  // every rank.
  if (!region.sequence()) return dy;
  return reduce_scatter_from_tp_backward(region.split, dy, region.proj, region.rows, C);
}

}  // namespace tessera::nn
