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

MixtureOfExperts::MixtureOfExperts(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg,
                                   int layer, ExpertSplit split)
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
    experts.mark_gemm_weight(p.fc_w);
    experts.mark_gemm_weight(p.proj_w);
    experts_.push_back(p);
  }
  dispatch_label_ = "dispatch h." + std::to_string(layer);
  combine_label_ = "combine h." + std::to_string(layer);
  reset_stats();
}

void MixtureOfExperts::reset_stats() const {
  stats_ = MoeStats{};
  stats_.layer = layer_;
  stats_.load.assign(static_cast<size_t>(m_.experts), 0);
}

MixtureOfExperts::Record MixtureOfExperts::make_record(int max_batch, Allocator& alloc) const {
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

MixtureOfExperts::Workspace MixtureOfExperts::make_workspace(Allocator& alloc) {
  Workspace ws;
  ws.alloc = &alloc;
  return ws;
}

PendingExchange MixtureOfExperts::plan_rows(Record& r) const {
  const int n = split_.size(), E = m_.experts, kk = m_.top_k, self = split_.rank();
  const int64_t A = static_cast<int64_t>(r.B) * r.T * kk;
  r.send_counts.assign(static_cast<size_t>(E), 0);
  for (int64_t a = 0; a < A; ++a)
    if (r.kept[a]) ++r.send_counts[r.expert[a]];
  // The first row of each expert: the other ranks' experts in rank order, then this rank's own.
  std::vector<int64_t> next_row(static_cast<size_t>(E), 0);
  int64_t row = 0;
  for (const bool own : {false, true})
    for (int e = 0; e < E; ++e)
      if ((e / local_ == self) == own) {
        next_row[e] = row;
        row += r.send_counts[e];
      }
  r.K = row;
  r.send_rows.assign(static_cast<size_t>(n), 0);
  for (int e = 0; e < E; ++e)
    if (e / local_ != self) r.send_rows[e / local_] += static_cast<size_t>(r.send_counts[e]);
  r.K_remote = r.K;
  for (int e = first_expert_; e < first_expert_ + local_; ++e) r.K_remote -= r.send_counts[e];
  r.row_of.assign(static_cast<size_t>(A), -1);
  r.token_of.assign(static_cast<size_t>(r.K), 0);
  for (int64_t a = 0; a < A; ++a) {
    if (!r.kept[a]) continue;
    const int64_t rw = next_row[r.expert[a]]++;
    r.row_of[a] = rw;
    r.token_of[rw] = a / kk;
  }
  r.counts.assign(static_cast<size_t>(n) * local_, 0);
  if (n == 1) {
    std::copy(r.send_counts.begin(), r.send_counts.end(), r.counts.begin());
    return {};
  }
  // Block s of send_counts (experts [s El, (s+1) El)) goes to rank s.
  return post_counts(split_.group, r.send_counts.data(), r.counts.data(), local_,
                     dispatch_label_ + " (counts)");
}

void MixtureOfExperts::plan_receive(Record& r) const {
  const int n = split_.size(), self = split_.rank();
  r.recv_rows.assign(static_cast<size_t>(n), 0);
  r.R = 0;
  for (int s = 0; s < n; ++s) {
    if (s == self) continue;
    for (int el = 0; el < local_; ++el)
      r.recv_rows[s] += static_cast<size_t>(r.counts[s * local_ + el]);
    r.R += static_cast<int64_t>(r.recv_rows[s]);
  }
}

std::vector<MixtureOfExperts::RowBlock> MixtureOfExperts::local_blocks(const Record& r) const {
  std::vector<RowBlock> blocks;
  int64_t begin = 0;
  for (int el = 0; el < local_; ++el) {
    const int64_t rows = r.send_counts[first_expert_ + el];
    if (rows > 0) blocks.push_back({el, begin, rows});
    begin += rows;
  }
  return blocks;
}

std::vector<MixtureOfExperts::RowBlock> MixtureOfExperts::remote_blocks(const Record& r) const {
  std::vector<RowBlock> blocks;
  int64_t begin = 0;
  for (int s = 0; s < split_.size(); ++s) {
    if (s == split_.rank()) continue;
    for (int el = 0; el < local_; ++el) {
      const int64_t rows = r.counts[s * local_ + el];
      if (rows > 0) blocks.push_back({el, begin, rows});
      begin += rows;
    }
  }
  return blocks;
}

std::vector<MixtureOfExperts::RowBlock> MixtureOfExperts::pieces(
    const std::vector<RowBlock>& blocks) const {
  if (split_.size() == 1) return blocks;  // nothing to overlap: whole blocks, the largest GEMMs
  // Equal pieces of at most about 2^28 flops of expert forward (16 C^2 per row), and at least 256
  // rows, so that the pieces stay large GEMMs (bench/engine/bench_gemm_rows measures the rows
  // against the BLAS's speed).
  const int64_t C = cfg_.n_embd;
  const int64_t max_rows = std::clamp<int64_t>((int64_t{1} << 28) / (16 * C * C), 256, 2048);
  std::vector<RowBlock> out;
  for (const RowBlock& b : blocks) {
    const int64_t n = (b.rows + max_rows - 1) / max_rows, rows = (b.rows + n - 1) / n;
    for (int64_t at = 0; at < b.rows; at += rows)
      out.push_back({b.el, b.begin + at, std::min(rows, b.rows - at)});
  }
  return out;
}

void MixtureOfExperts::block_forward(const RowBlock& b, ExpertRows& side, float* out) const {
  const int C = cfg_.n_embd, F = 4 * C, M = static_cast<int>(b.rows);
  auto ep = [&](int i) { return eps_.param_data(i); };
  auto w = [&](int i) { return eps_.gemm_weight(i); };  // refreshed by forward
  const ExpertParams& q = experts_[static_cast<size_t>(b.el)];
  float* fc = side.fc.f32() + b.begin * F;
  float* fch = side.fch.f32() + b.begin * F;
  k::matmul_forward(fc, side.in.f32() + b.begin * C, w(q.fc_w), ep(q.fc_b), nullptr, M, C, F);
  k::gelu_forward(fch, fc, b.rows * F);
  k::matmul_forward(out + b.begin * C, fch, w(q.proj_w), ep(q.proj_b), nullptr, M, F, C);
}

void MixtureOfExperts::block_backward_data(const RowBlock& b, const ExpertRows& side,
                                           const float* dy, float* dfc, float* dx) const {
  const int C = cfg_.n_embd, F = 4 * C, M = static_cast<int>(b.rows);
  auto w = [&](int i) { return eps_.gemm_weight(i); };  // as the forward read them
  const ExpertParams& q = experts_[static_cast<size_t>(b.el)];
  float* df = dfc + b.begin * F;
  k::matmul_backward(df, nullptr, nullptr, dy + b.begin * C, nullptr, w(q.proj_w), M, F, C);
  k::gelu_backward(df, df, side.fc.f32() + b.begin * F, b.rows * F);
  k::matmul_backward(dx + b.begin * C, nullptr, nullptr, df, nullptr, w(q.fc_w), M, C, F);
}

void MixtureOfExperts::block_backward_weights(const RowBlock& b, const ExpertRows& side,
                                              const float* dy, const float* dfc) const {
  const int C = cfg_.n_embd, F = 4 * C, M = static_cast<int>(b.rows);
  auto eg = [&](int i) { return eps_.grad_data(i); };
  const ExpertParams& q = experts_[static_cast<size_t>(b.el)];
  k::matmul_backward(nullptr, eg(q.proj_w), eg(q.proj_b), dy + b.begin * C,
                     side.fch.f32() + b.begin * F, nullptr, M, F, C);
  k::matmul_backward(nullptr, eg(q.fc_w), eg(q.fc_b), dfc + b.begin * F,
                     side.in.f32() + b.begin * C, nullptr, M, C, F);
}

void MixtureOfExperts::forward(const float* x, float* out, int B, int T, float loss_scale,
                               Record& r, Workspace& ws, bool count_stats) const {
  const int E = m_.experts, kk = m_.top_k, C = cfg_.n_embd, F = 4 * C;
  const int64_t N = static_cast<int64_t>(B) * T;
  r.B = B, r.T = T, r.loss_scale = loss_scale, r.x = x;
  auto p = [&](int i) { return ps_.param_data(i); };

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

  // The rows: those for the other ranks into the send buffer, this rank's own into local.in.
  PendingExchange counts = plan_rows(r);
  for (const ExpertParams& q : experts_) {  // (a bf16 model's copies, read by every row block)
    eps_.refresh_bf16_copy(q.fc_w);
    eps_.refresh_bf16_copy(q.proj_w);
  }
  const int64_t K_local = r.K - r.K_remote;
  float* send = ensure(ws.send, r.K_remote * C, "moe.send", ws.alloc);
  float* local_in = ensure(r.local.in, K_local * C, "moe.expert_input", r.alloc);
  ensure(r.local.fc, K_local * F, "moe.fc", r.alloc);
  ensure(r.local.fch, K_local * F, "moe.fc.gelu", r.alloc);
  for (int64_t row = 0; row < r.K; ++row) {
    float* dst = row < r.K_remote ? send + row * C : local_in + (row - r.K_remote) * C;
    copy_rows(dst, x + r.token_of[row] * C, 1, C);
  }
  float* o = ensure(r.out, r.K * C, "moe.output", r.alloc);

  // The experts. The other ranks' rows as soon as they are here (those ranks wait for their
  // outputs), this rank's own rows meanwhile; then the combine brings this rank's rows back.
  PendingExchange dispatch, combine;
  const std::vector<RowBlock> local = pieces(local_blocks(r));
  size_t next = 0;
  bool remote_done = split_.size() == 1;
  for (;;) {
    if (!remote_done) {
      if (!dispatch.posted() && counts.done()) {
        counts.wait();
        plan_receive(r);
        float* recv = ensure(r.remote.in, r.R * C, "moe.expert_input", r.alloc);
        ensure(r.remote.fc, r.R * F, "moe.fc", r.alloc);
        ensure(r.remote.fch, r.R * F, "moe.fc.gelu", r.alloc);
        dispatch =
            post_rows(split_.group, send, r.send_rows, recv, r.recv_rows, C, dispatch_label_);
      }
      if (dispatch.done()) {
        dispatch.wait();
        float* ye = ensure(ws.ye, r.R * C, "moe.expert_output", ws.alloc);
        for (const RowBlock& b : remote_blocks(r)) block_forward(b, r.remote, ye);
        combine = post_rows(split_.group, ye, r.recv_rows, o, r.send_rows, C, combine_label_);
        remote_done = true;
        continue;
      }
    }
    if (next < local.size()) {
      block_forward(local[next++], r.local, o + r.K_remote * C);
      continue;
    }
    if (remote_done) break;
    if (dispatch.posted())  // nothing left to do meanwhile
      dispatch.wait();
    else
      counts.wait();
  }
  combine.wait();

  // out_t = sum_j kept gate_j y_j.
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

void MixtureOfExperts::backward(const Record& r, const float* dout, float* dx,
                                Workspace& ws) const {
  TESSERA_ASSERT(r.B > 0 && r.x != nullptr, "MixtureOfExperts::backward of h.", layer_,
                 " without a forward");
  const int E = m_.experts, kk = m_.top_k, C = cfg_.n_embd, F = 4 * C;
  const int64_t N = static_cast<int64_t>(r.B) * r.T, K_local = r.K - r.K_remote;
  auto p = [&](int i) { return ps_.param_data(i); };

  // Gates: dgate_tj = dout_t . y_tj; each row's output gradient gate_tj dout_t, in the row order.
  ws.dgate.assign(static_cast<size_t>(N * kk), 0.0f);
  float* dy = ensure(ws.send, r.K * C, "moe.send", ws.alloc);
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
      float* ds = dy + rw * C;
      for (int c = 0; c < C; ++c) ds[c] = g * d[c];
    }
  float* dx_rows = ensure(ws.dx_rows, r.K * C, "moe.d_rows", ws.alloc);
  float* dy_remote = ensure(ws.dy_remote, r.R * C, "moe.d_expert_output", ws.alloc);
  float* dx_remote = ensure(ws.ye, r.R * C, "moe.expert_output", ws.alloc);
  float* dfc_local = ensure(ws.dfc_local, K_local * F, "moe.d_fc", ws.alloc);
  float* dfc_remote = ensure(ws.dfc_remote, r.R * F, "moe.d_fc", ws.alloc);
  const float* dy_local = dy + r.K_remote * C;
  float* dx_local = dx_rows + r.K_remote * C;

  // The experts' backward, overlapped as in forward: the other ranks' rows as soon as their
  // gradients are here, this rank's own rows (inputs, then weights) meanwhile, and the weight
  // gradients of the other ranks' rows while their input gradients travel back.
  PendingExchange dispatch, combine;
  if (split_.size() > 1)
    dispatch = post_rows(split_.group, dy, r.send_rows, dy_remote, r.recv_rows, C,
                         dispatch_label_ + " (backward)");
  const std::vector<RowBlock> local = local_blocks(r), remote = remote_blocks(r);
  const std::vector<RowBlock> local_data = pieces(local);
  size_t next = 0;  // local tasks: the input gradient of each block, then its weights'
  bool remote_done = split_.size() == 1;
  for (;;) {
    if (!remote_done && dispatch.done()) {
      dispatch.wait();
      for (const RowBlock& b : remote)
        block_backward_data(b, r.remote, dy_remote, dfc_remote, dx_remote);
      combine = post_rows(split_.group, dx_remote, r.recv_rows, dx_rows, r.send_rows, C,
                          combine_label_ + " (backward)");
      remote_done = true;
      continue;
    }
    if (next < local_data.size() + local.size()) {
      if (next < local_data.size())
        block_backward_data(local_data[next], r.local, dy_local, dfc_local, dx_local);
      else
        block_backward_weights(local[next - local_data.size()], r.local, dy_local, dfc_local);
      ++next;
      continue;
    }
    if (remote_done) break;
    dispatch.wait();  // nothing left to do meanwhile
  }
  // Each expert's weight gradient: its own rows' blocks (above), then the other ranks' in order.
  for (const RowBlock& b : remote) block_backward_weights(b, r.remote, dy_remote, dfc_remote);
  combine.wait();

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
      const float* v = dx_rows + rw * C;
      for (int c = 0; c < C; ++c) d[c] += v[c];
    }
}

}  // namespace tessera::nn
