#include "tessera/nn/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessera/comm/launch.h"
#include "tessera/core/error.h"
#include "tessera/core/trace.h"
#include "tessera/kernels/gemm.h"
#include "tessera/nn/linear.h"
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
    : MixtureOfExperts(ps, experts, cfg, layer, split, nullptr, comm::one_rank()) {}

MixtureOfExperts::MixtureOfExperts(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg,
                                   int layer, ExpertSplit split, ContextSplit context)
    : MixtureOfExperts(ps, experts, cfg, layer, split, &context.group, nullptr) {}

MixtureOfExperts::MixtureOfExperts(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg,
                                   int layer, ExpertSplit split, comm::Communicator* context,
                                   std::unique_ptr<comm::Communicator> own_context)
    : ps_(ps),
      eps_(experts),
      cfg_(cfg),
      m_(cfg.moe),
      layer_(layer),
      split_(split),
      own_context_(std::move(own_context)),
      context_(context ? *context : *own_context_),
      names_(moe_names(cfg, layer)) {
  const int E = m_.experts, n = split.size();
  TESSERA_CHECK_AS(ConfigError, E > 0 && E % n == 0, "--moe-experts ", E,
                   " does not split over --ep ", n,
                   " ranks; choose an expert count that is a multiple of ep");
  local_ = E / n;
  first_expert_ = split.rank() * local_;
  const int64_t C = cfg.n_embd;
  router_ =
      ps.add(names_.router, cfg.llama() ? Shape{E, C} : Shape{C, E}, Init::Normal, kInitStd, true);
  experts_ = make_expert_mlps(experts, cfg, layer, first_expert_, local_);
  dispatch_label_ = "dispatch h." + std::to_string(layer);
  combine_label_ = "combine h." + std::to_string(layer);
  reset_stats();
}

Linear MixtureOfExperts::router() const {
  Linear l;
  l.weight = router_;
  l.in = cfg_.n_embd, l.out = m_.experts;
  l.transposed = cfg_.llama();
  return l;
}

void MixtureOfExperts::set_score_bias(std::vector<float> bias) const {
  TESSERA_ASSERT(bias.empty() || static_cast<int>(bias.size()) == m_.experts,
                 "a selection bias of ", bias.size(), " values for ", m_.experts, " experts");
  score_bias_ = std::move(bias);
}

void MixtureOfExperts::reset_stats() const {
  stats_ = MoeStats{};
  stats_.layer = layer_;
  stats_.load.assign(static_cast<size_t>(m_.experts), 0);
}

MixtureOfExperts::Record MixtureOfExperts::make_record(int max_batch, Allocator& alloc) const {
  const int64_t N = max_batch * context_.rows_per_sequence(cfg_.block_size), E = m_.experts;
  Record r;
  r.alloc = &alloc;
  const std::string& h = names_.prefix;
  r.logits =
      Tensor::zeros({N * E}, DType::F32, MemCategory::Activations, h + "router.logits", &alloc);
  r.probs =
      Tensor::zeros({N * E}, DType::F32, MemCategory::Activations, h + "router.probs", &alloc);
  r.lse = Tensor::zeros({N}, DType::F32, MemCategory::Activations, h + "router.lse", &alloc);
  if (m_.score == RouterScore::Sigmoid)
    r.scores =
        Tensor::zeros({N * E}, DType::F32, MemCategory::Activations, h + "router.scores", &alloc);
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
  // Equal pieces of at most about 2^28 flops of expert forward (16 C^2 per row for GPT-2's
  // experts), and at least 256
  // rows, so that the pieces stay large GEMMs (bench/engine/bench_gemm_rows measures the rows
  // against the BLAS's speed).
  const int64_t max_rows =
      std::clamp<int64_t>((int64_t{1} << 28) / experts_->flops_per_row(), 256, 2048);
  std::vector<RowBlock> out;
  for (const RowBlock& b : blocks) {
    const int64_t n = (b.rows + max_rows - 1) / max_rows, rows = (b.rows + n - 1) / n;
    for (int64_t at = 0; at < b.rows; at += rows)
      out.push_back({b.el, b.begin + at, std::min(rows, b.rows - at)});
  }
  return out;
}

void MixtureOfExperts::block_forward(const RowBlock& b, ExpertRows& side, float* out) const {
  const int64_t C = cfg_.n_embd, A = experts_->act_width(), H = experts_->hid_width();
  experts_->forward(b.el, b.rows, side.in.f32() + b.begin * C, side.act.f32() + b.begin * A,
                    side.hid.f32() + b.begin * H, out + b.begin * C);
}

void MixtureOfExperts::block_backward_data(const RowBlock& b, const ExpertRows& side,
                                           const float* dy, float* dact, float* dx,
                                           Workspace& ws) const {
  const int64_t C = cfg_.n_embd, A = experts_->act_width();
  float* scratch =
      experts_->scratch_width() > 0
          ? ensure(ws.dhid, b.rows * experts_->scratch_width(), "moe.d_hidden", ws.alloc)
          : nullptr;
  experts_->backward_data(b.el, b.rows, side.act.f32() + b.begin * A, dy + b.begin * C,
                          dact + b.begin * A, dx + b.begin * C, scratch);
}

void MixtureOfExperts::block_backward_weights(const RowBlock& b, const ExpertRows& side,
                                              const float* dy, const float* dact) const {
  const int64_t C = cfg_.n_embd, A = experts_->act_width(), H = experts_->hid_width();
  experts_->backward_weights(b.el, b.rows, side.in.f32() + b.begin * C,
                             side.hid.f32() + b.begin * H, dy + b.begin * C, dact + b.begin * A);
}

int64_t MixtureOfExperts::route_whole_sequences(Record& r, const int64_t* positions) const {
  const int n = context_.size(), E = m_.experts, kk = m_.top_k, B = r.B, T = r.T, L = r.seq_len;
  // Each rank's [T positions | B T k choices], gathered over the cp group.
  const int64_t per = T + static_cast<int64_t>(B) * T * kk;
  std::vector<int32_t> mine(static_cast<size_t>(per)), all(static_cast<size_t>(per * n));
  for (int t = 0; t < T; ++t) mine[static_cast<size_t>(t)] = static_cast<int32_t>(positions[t]);
  std::copy(r.expert.begin(), r.expert.end(), mine.begin() + T);
  context_.group.all_gather(mine.data(), all.data(), mine.size(), DType::I32).wait();
  // The whole sequences' choices [B, L, k] in position order.
  std::vector<int32_t> whole(static_cast<size_t>(B) * L * kk);
  for (int s = 0; s < n; ++s) {
    const int32_t* from = all.data() + s * per;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        std::copy_n(from + T + (static_cast<int64_t>(b) * T + t) * kk, kk,
                    whole.begin() + (static_cast<int64_t>(b) * L + from[t]) * kk);
  }
  std::vector<uint8_t> kept(whole.size());
  router_capacity(kept.data(), whole.data(), B, L, E, kk, expert_capacity(m_, L));
  r.seq_counts.assign(static_cast<size_t>(B) * E, 0.0);
  for (int b = 0; b < B; ++b)
    for (int64_t a = 0; a < static_cast<int64_t>(L) * kk; ++a)
      r.seq_counts[static_cast<size_t>(b * E + whole[static_cast<size_t>(b * L * kk + a)])] += 1.0;
  int64_t dropped = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < kk; ++j) {
        const uint8_t k = kept[static_cast<size_t>((b * L + positions[t]) * kk + j)];
        r.kept[static_cast<size_t>((b * T + t) * kk + j)] = k;
        dropped += k ? 0 : 1;
      }
  return dropped;
}

void MixtureOfExperts::forward(const float* x, float* out, int B, int T, float loss_scale,
                               Record& r, Workspace& ws, bool count_stats,
                               const int64_t* positions) const {
  const int E = m_.experts, kk = m_.top_k, C = cfg_.n_embd;
  const int64_t A = experts_->act_width(), H = experts_->hid_width();
  const int64_t N = static_cast<int64_t>(B) * T;
  const bool split = positions != nullptr && context_.size() > 1;
  r.B = B, r.T = T, r.loss_scale = loss_scale, r.x = x;
  r.seq_len = split ? T * context_.size() : T;
  r.seq_counts.clear();

  // Route (fp32 in every precision): logits, scores, top-k (biased selection, gates renormalised
  // or not), per-sequence capacity.
  {
    k::GemmModeScope fp32(k::GemmMode{});
    linear_forward(ps_, router(), r.logits.f32(), E, x, N);
  }
  const bool sigmoid = m_.score == RouterScore::Sigmoid;
  if (sigmoid)
    router_sigmoid(r.scores.f32(), r.probs.f32(), r.lse.f32(), r.logits.f32(), N, E);
  else
    router_softmax(r.probs.f32(), r.lse.f32(), r.logits.f32(), N, E);
  r.expert.resize(static_cast<size_t>(N * kk));
  r.gate.resize(r.expert.size());
  r.kept.resize(r.expert.size());
  router_top_k(r.expert.data(), r.gate.data(), sigmoid ? r.scores.f32() : r.probs.f32(), N, E, kk,
               score_bias_.empty() ? nullptr : score_bias_.data(), m_.renormalize);
  const int64_t dropped =
      split ? route_whole_sequences(r, positions)
            : router_capacity(r.kept.data(), r.expert.data(), B, T, E, kk, expert_capacity(m_, T));
  if (count_stats) {
    const RouterLossSums s = router_loss_sums(r.probs.f32(), r.lse.f32(), r.expert.data(), B, T, E,
                                              kk, split ? r.seq_counts.data() : nullptr, r.seq_len);
    stats_.balance_sum += s.balance;
    stats_.z_sum += s.z;
    stats_.sequences += split && context_.rank() != 0 ? 0 : B;  // a sequence once
    stats_.tokens += N;
    for (int32_t e : r.expert) ++stats_.load[static_cast<size_t>(e)];
    stats_.assignments += N * kk;
    stats_.dropped += dropped;
  }

  // The rows: those for the other ranks into the send buffer, this rank's own into local.in.
  PendingExchange counts = plan_rows(r);
  experts_->refresh_bf16_copies();  // (a bf16 model's copies, read by every row block)
  const int64_t K_local = r.K - r.K_remote;
  float* send = ensure(ws.send, r.K_remote * C, "moe.send", ws.alloc);
  float* local_in = ensure(r.local.in, K_local * C, "moe.expert_input", r.alloc);
  ensure(r.local.act, K_local * A, "moe.expert_act", r.alloc);
  ensure(r.local.hid, K_local * H, "moe.expert_hidden", r.alloc);
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
        ensure(r.remote.act, r.R * A, "moe.expert_act", r.alloc);
        ensure(r.remote.hid, r.R * H, "moe.expert_hidden", r.alloc);
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
  const int E = m_.experts, kk = m_.top_k, C = cfg_.n_embd;
  const int64_t A = experts_->act_width();
  const int64_t N = static_cast<int64_t>(r.B) * r.T, K_local = r.K - r.K_remote;

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
  float* dfc_local = ensure(ws.dfc_local, K_local * A, "moe.d_expert_act", ws.alloc);
  float* dfc_remote = ensure(ws.dfc_remote, r.R * A, "moe.d_expert_act", ws.alloc);
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
        block_backward_data(b, r.remote, dy_remote, dfc_remote, dx_remote, ws);
      combine = post_rows(split_.group, dx_remote, r.recv_rows, dx_rows, r.send_rows, C,
                          combine_label_ + " (backward)");
      remote_done = true;
      continue;
    }
    if (next < local_data.size() + local.size()) {
      if (next < local_data.size())
        block_backward_data(local_data[next], r.local, dy_local, dfc_local, dx_local, ws);
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
  const float bw = m_.aux_loss * r.loss_scale, zw = m_.z_loss * r.loss_scale;
  const double* counts = r.seq_counts.empty() ? nullptr : r.seq_counts.data();
  if (m_.score == RouterScore::Sigmoid)
    router_backward_sigmoid(dlogits, ws.dgate.data(), r.scores.f32(), r.probs.f32(), r.lse.f32(),
                            r.logits.f32(), r.expert.data(), r.gate.data(), r.B, r.T, E, kk, bw, zw,
                            m_.renormalize, counts, r.seq_len);
  else
    router_backward(dlogits, ws.dgate.data(), r.probs.f32(), r.lse.f32(), r.expert.data(),
                    r.gate.data(), r.B, r.T, E, kk, bw, zw, m_.renormalize, counts, r.seq_len);
  {
    k::GemmModeScope fp32(k::GemmMode{});  // the router is fp32 in every precision
    linear_backward(ps_, router(), dx, false, ps_.grad_data(router_), nullptr, dlogits, E, r.x, N);
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
