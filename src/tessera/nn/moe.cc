#include "tessera/nn/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/trace.h"
#include "tessera/kernels/gelu.h"
#include "tessera/kernels/gemm.h"
#include "tessera/nn/moe_router.h"

namespace tessera::nn {

namespace k = tessera::kernels;

namespace {
constexpr float kInitStd = 0.02f;

// t holds at least n elements afterwards (grown by a quarter when too small; contents not kept).
float* ensure(Tensor& t, int64_t n, const char* name, Allocator* alloc) {
  if (!t.defined() || t.numel() < n)
    t = Tensor::zeros({std::max<int64_t>(16, n + n / 4)}, DType::F32, MemCategory::Activations,
                      name, alloc);
  return t.f32();
}

void copy_rows(float* dst, const float* src, int64_t rows, int C) {
  if (rows > 0) std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(rows * C));
}
}  // namespace

MoeMlp::MoeMlp(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg, int layer,
               ExpertSplit split)
    : ps_(ps), eps_(experts), cfg_(cfg), m_(cfg.moe), layer_(layer), split_(split) {
  const int E = m_.experts, n = split.size();
  TESSERA_CHECK_AS(ConfigError, E > 0 && E % n == 0, "--moe-experts ", E,
                   " does not split over --ep ", n,
                   " ranks; choose an expert count that is a multiple of ep");
  local_ = E / n;
  first_expert_ = split.rank() * local_;
  const int64_t C = cfg.n_embd, F = 4 * C;
  const float proj_std = kInitStd / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  const std::string h = "h." + std::to_string(layer) + ".mlp.";
  router_ = ps.add(h + "router.weight", {C, E}, Init::Normal, kInitStd, true);
  for (int el = 0; el < local_; ++el) {
    const std::string e = h + "experts." + std::to_string(first_expert_ + el) + ".";
    ExpertParams p;
    p.fc_w = experts.add(e + "c_fc.weight", {C, F}, Init::Normal, kInitStd, true);
    p.fc_b = experts.add(e + "c_fc.bias", {F}, Init::Zeros, 0.0f, false);
    p.proj_w = experts.add(e + "c_proj.weight", {F, C}, Init::Normal, proj_std, true);
    p.proj_b = experts.add(e + "c_proj.bias", {C}, Init::Zeros, 0.0f, false);
    experts_.push_back(p);
  }
  dispatch_label_ = "dispatch h." + std::to_string(layer);
  combine_label_ = "combine h." + std::to_string(layer);
  reset_stats();
}

void MoeMlp::reset_stats() const {
  stats_ = MoeStats{};
  stats_.layer = layer_;
  stats_.load.assign(static_cast<size_t>(m_.experts), 0);
}

MoeMlp::Record MoeMlp::make_record(int max_batch, Allocator& alloc) const {
  const int64_t N = static_cast<int64_t>(max_batch) * cfg_.block_size, E = m_.experts;
  Record r;
  r.alloc = &alloc;
  const std::string h = "h." + std::to_string(layer_) + ".mlp.";
  r.logits =
      Tensor::zeros({N * E}, DType::F32, MemCategory::Activations, h + "router.logits", &alloc);
  r.probs =
      Tensor::zeros({N * E}, DType::F32, MemCategory::Activations, h + "router.probs", &alloc);
  r.lse = Tensor::zeros({N}, DType::F32, MemCategory::Activations, h + "router.lse", &alloc);
  return r;
}

MoeMlp::Workspace MoeMlp::make_workspace(Allocator& alloc) {
  Workspace ws;
  ws.alloc = &alloc;
  return ws;
}

void MoeMlp::exchange(const float* send, const std::vector<size_t>& send_rows, float* recv,
                      const std::vector<size_t>& recv_rows) const {
  const int C = cfg_.n_embd;
  if (split_.size() == 1) {
    copy_rows(recv, send, static_cast<int64_t>(send_rows[0]), C);
    return;
  }
  std::vector<size_t> sc(send_rows), rc(recv_rows);
  for (size_t& c : sc) c *= static_cast<size_t>(C);
  for (size_t& c : rc) c *= static_cast<size_t>(C);
  split_.group->all_to_allv(send, sc, recv, rc, DType::F32).wait();
}

// Receive order: for each source s, its rows for local expert 0, 1, ...; experts' order: for each
// local expert el, its rows from source 0, 1, ...
void MoeMlp::permute_rows(const float* src, float* dst, const Record& r, bool to_experts) const {
  const int n = split_.size(), C = cfg_.n_embd;
  int64_t expert_row = 0;
  for (int el = 0; el < local_; ++el)
    for (int s = 0; s < n; ++s) {
      int64_t source_row = 0;
      for (int s2 = 0; s2 < s; ++s2) source_row += static_cast<int64_t>(r.recv_rows[s2]);
      for (int e2 = 0; e2 < el; ++e2) source_row += r.recv_counts[s * local_ + e2];
      const int64_t rows = r.recv_counts[s * local_ + el];
      if (to_experts)
        copy_rows(dst + expert_row * C, src + source_row * C, rows, C);
      else
        copy_rows(dst + source_row * C, src + expert_row * C, rows, C);
      expert_row += rows;
    }
}

// Sorts the kept assignments by expert (then token, then choice: a stable order), counts the rows
// for each rank, and exchanges the per-expert counts so every rank knows what it will receive.
void MoeMlp::plan_dispatch(Record& r) const {
  const int n = split_.size(), E = m_.experts, kk = m_.top_k;
  const int64_t A = static_cast<int64_t>(r.B) * r.T * kk;
  std::vector<int64_t> per_expert(static_cast<size_t>(E) + 1, 0);
  for (int64_t a = 0; a < A; ++a)
    if (r.kept[a]) ++per_expert[r.expert[a] + 1];
  std::vector<int64_t> send_counts(per_expert.begin() + 1, per_expert.end());  // [E]
  for (int e = 0; e < E; ++e) per_expert[e + 1] += per_expert[e];  // start of each expert's rows
  r.K = per_expert[E];
  r.row_of.assign(static_cast<size_t>(A), -1);
  r.token_of.assign(static_cast<size_t>(r.K), 0);
  for (int64_t a = 0; a < A; ++a) {
    if (!r.kept[a]) continue;
    const int64_t row = per_expert[r.expert[a]]++;
    r.row_of[a] = row;
    r.token_of[row] = a / kk;
  }
  r.send_rows.assign(static_cast<size_t>(n), 0);
  for (int e = 0; e < E; ++e) r.send_rows[e / local_] += static_cast<size_t>(send_counts[e]);
  r.recv_counts.assign(static_cast<size_t>(n) * local_, 0);
  if (n == 1) {
    std::copy(send_counts.begin(), send_counts.end(), r.recv_counts.begin());
  } else {
    // Block s of send_counts (experts [s El, (s+1) El)) goes to rank s.
    split_.group
        ->all_to_all(send_counts.data(), r.recv_counts.data(), static_cast<size_t>(local_),
                     DType::I64)
        .wait();
  }
  r.recv_rows.assign(static_cast<size_t>(n), 0);
  r.R = 0;
  for (int s = 0; s < n; ++s)
    for (int el = 0; el < local_; ++el) {
      r.recv_rows[s] += static_cast<size_t>(r.recv_counts[s * local_ + el]);
      r.R += r.recv_counts[s * local_ + el];
    }
}

void MoeMlp::forward(const float* x, float* out, int B, int T, float loss_scale, Record& r,
                     Workspace& ws, bool count_stats) const {
  const int E = m_.experts, kk = m_.top_k, C = cfg_.n_embd, F = 4 * C;
  const int64_t N = static_cast<int64_t>(B) * T;
  r.B = B, r.T = T, r.loss_scale = loss_scale, r.x = x;
  auto p = [&](int i) { return ps_.param_data(i); };
  auto ep = [&](int i) { return eps_.param_data(i); };

  // Route (fp32 in every precision): logits, softmax, top-k with renormalised gates,
  // per-sequence capacity.
  {
    k::GemmModeScope fp32(k::GemmMode{});
    k::matmul_forward(r.logits.f32(), x, p(router_), nullptr, nullptr, static_cast<int>(N), C, E);
  }
  router_softmax(r.probs.f32(), r.lse.f32(), r.logits.f32(), N, E);
  r.expert.resize(static_cast<size_t>(N * kk));
  r.gate.resize(r.expert.size());
  r.kept.resize(r.expert.size());
  router_top_k(r.expert.data(), r.gate.data(), r.probs.f32(), N, E, kk);
  const int64_t dropped =
      router_capacity(r.kept.data(), r.expert.data(), B, T, E, kk, expert_capacity(m_, T));
  if (count_stats) {
    const RouterLossSums s =
        router_loss_sums(r.probs.f32(), r.lse.f32(), r.expert.data(), B, T, E, kk);
    stats_.balance_sum += s.balance;
    stats_.z_sum += s.z;
    stats_.sequences += B;
    stats_.tokens += N;
    for (int32_t e : r.expert) ++stats_.load[static_cast<size_t>(e)];
    stats_.assignments += N * kk;
    stats_.dropped += dropped;
  }

  // Dispatch: each kept assignment's token row to the rank holding its expert.
  float* recv;
  {
    TraceSpan span(dispatch_label_, "moe", 1);
    plan_dispatch(r);
    float* send = ensure(ws.send, r.K * C, "moe.send", ws.alloc);
    for (int64_t row = 0; row < r.K; ++row)
      copy_rows(send + row * C, x + r.token_of[row] * C, 1, C);
    recv = ensure(ws.recv, r.R * C, "moe.recv", ws.alloc);
    exchange(send, r.send_rows, recv, r.recv_rows);
  }

  // The experts, each on all the rows it received.
  float* xe = ensure(r.xe, r.R * C, "moe.expert_input", r.alloc);
  float* fc = ensure(r.fc, r.R * F, "moe.fc", r.alloc);
  float* fch = ensure(r.fch, r.R * F, "moe.fc.gelu", r.alloc);
  float* ye = ensure(ws.ye, r.R * C, "moe.expert_output", ws.alloc);
  permute_rows(recv, xe, r, true);
  int64_t row = 0;
  for (int el = 0; el < local_; ++el) {
    int64_t rows = 0;
    for (int s = 0; s < split_.size(); ++s) rows += r.recv_counts[s * local_ + el];
    if (rows == 0) continue;
    const ExpertParams& q = experts_[static_cast<size_t>(el)];
    const int M = static_cast<int>(rows);
    k::matmul_forward(fc + row * F, xe + row * C, ep(q.fc_w), ep(q.fc_b), nullptr, M, C, F);
    k::gelu_forward(fch + row * F, fc + row * F, rows * F);
    k::matmul_forward(ye + row * C, fch + row * F, ep(q.proj_w), ep(q.proj_b), nullptr, M, F, C);
    row += rows;
  }

  // Combine: the outputs back to their tokens' ranks, then out_t = sum_j kept gate_j y_j.
  float* o = ensure(r.out, r.K * C, "moe.output", r.alloc);
  {
    TraceSpan span(combine_label_, "moe", 1);
    permute_rows(ye, recv, r, false);
    exchange(recv, r.recv_rows, o, r.send_rows);
  }
  for (int64_t t = 0; t < N; ++t) {
    float* y = out + t * C;
    std::fill(y, y + C, 0.0f);
    for (int j = 0; j < kk; ++j) {
      const int64_t rw = r.row_of[t * kk + j];
      if (rw < 0) continue;
      const float g = r.gate[t * kk + j];
      const float* v = o + rw * C;
      for (int c = 0; c < C; ++c) y[c] += g * v[c];
    }
  }
}

void MoeMlp::backward(const Record& r, const float* dout, float* dx, Workspace& ws) const {
  TESSERA_ASSERT(r.B > 0 && r.x != nullptr, "MoeMlp::backward of h.", layer_, " without a forward");
  const int E = m_.experts, kk = m_.top_k, C = cfg_.n_embd, F = 4 * C;
  const int64_t N = static_cast<int64_t>(r.B) * r.T;
  auto p = [&](int i) { return ps_.param_data(i); };
  auto ep = [&](int i) { return eps_.param_data(i); };
  auto eg = [&](int i) { return eps_.grad_data(i); };

  // Gates: dgate_tj = dout_t . y_tj; the experts' output gradients gate_tj dout_t, in send order.
  ws.dgate.assign(static_cast<size_t>(N * kk), 0.0f);
  float* dsend = ensure(ws.send, r.K * C, "moe.send", ws.alloc);
  const float* o = r.out.f32();
  for (int64_t t = 0; t < N; ++t)
    for (int j = 0; j < kk; ++j) {
      const int64_t rw = r.row_of[t * kk + j];
      if (rw < 0) continue;
      const float* d = dout + t * C;
      const float* v = o + rw * C;
      double dot = 0;
      for (int c = 0; c < C; ++c) dot += static_cast<double>(d[c]) * v[c];
      ws.dgate[t * kk + j] = static_cast<float>(dot);
      const float g = r.gate[t * kk + j];
      float* ds = dsend + rw * C;
      for (int c = 0; c < C; ++c) ds[c] = g * d[c];
    }
  float* drecv = ensure(ws.recv, r.R * C, "moe.recv", ws.alloc);
  float* dye = ensure(ws.ye, r.R * C, "moe.expert_output", ws.alloc);
  {
    TraceSpan span(dispatch_label_ + " (backward)", "moe", 1);
    exchange(dsend, r.send_rows, drecv, r.recv_rows);
  }
  permute_rows(drecv, dye, r, true);

  // The experts' backward; their input gradients overwrite dye row block by row block.
  float* dfch = ensure(ws.dfch, r.R * F, "moe.d_fc", ws.alloc);
  const float* xe = r.xe.f32();
  const float* fc = r.fc.f32();
  const float* fch = r.fch.f32();
  int64_t row = 0;
  for (int el = 0; el < local_; ++el) {
    int64_t rows = 0;
    for (int s = 0; s < split_.size(); ++s) rows += r.recv_counts[s * local_ + el];
    if (rows == 0) continue;
    const ExpertParams& q = experts_[static_cast<size_t>(el)];
    const int M = static_cast<int>(rows);
    float* df = dfch + row * F;
    k::matmul_backward(df, eg(q.proj_w), eg(q.proj_b), dye + row * C, fch + row * F, ep(q.proj_w),
                       M, F, C);
    k::gelu_backward(df, df, fc + row * F, rows * F);
    k::matmul_backward(dye + row * C, eg(q.fc_w), eg(q.fc_b), df, xe + row * C, ep(q.fc_w), M, C,
                       F);
    row += rows;
  }
  {
    TraceSpan span(combine_label_ + " (backward)", "moe", 1);
    permute_rows(dye, drecv, r, false);
    exchange(drecv, r.recv_rows, dsend, r.send_rows);
  }

  // Router: dlogits from the gates and the auxiliary losses; dx = dlogits . W^T, then the
  // experts' input gradients added token by token.
  float* dlogits = ensure(ws.dlogits, N * E, "moe.d_logits", ws.alloc);
  router_backward(dlogits, ws.dgate.data(), r.probs.f32(), r.lse.f32(), r.expert.data(),
                  r.gate.data(), r.B, r.T, E, kk, m_.aux_loss * r.loss_scale,
                  m_.z_loss * r.loss_scale);
  {
    k::GemmModeScope fp32(k::GemmMode{});  // the router is fp32 in every precision
    k::matmul_backward(dx, ps_.grad_data(router_), nullptr, dlogits, r.x, p(router_),
                       static_cast<int>(N), C, E);
  }
  for (int64_t t = 0; t < N; ++t)
    for (int j = 0; j < kk; ++j) {
      const int64_t rw = r.row_of[t * kk + j];
      if (rw < 0) continue;
      float* d = dx + t * C;
      const float* v = dsend + rw * C;
      for (int c = 0; c < C; ++c) d[c] += v[c];
    }
}

}  // namespace tessera::nn
