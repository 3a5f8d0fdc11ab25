#include "tessera/cuda/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/cuda/gemm.h"
#include "tessera/cuda/kernels.h"

namespace tessera::cuda {

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::F32;
  if (s == "bf16") return Precision::BF16;
  throw ConfigError("unknown precision '" + s + "' for the device: expected fp32 or bf16");
}

const char* to_string(Precision p) {
  return p == Precision::F32 ? "fp32" : "bf16";
}

namespace {

// One block's parameter offsets in the flat buffers.
struct BlockParams {
  int64_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};

// One block's saved activations ([M, width] with M = B T rows; att [B, heads, T, T]).
template <typename T>
struct BlockActs {
  DeviceArray<T> ln1, qkv, q, k, v, att, att_drop, atty, mid, ln2, fch, fcg;
  DeviceArray<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;
};

// Per-operation times from CUDA events recorded between the operations of a stream: the time
// between two marks belongs to the operation the second names.
class Profiler {
 public:
  explicit Profiler(bool on) : on_(on) {}
  ~Profiler() {
    for (cudaEvent_t e : pool_) (void)cudaEventDestroy(e);
  }
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;
  void start(cudaStream_t s) {
    if (!on_) return;
    marks_.clear();
    mark("start", s);
  }
  void mark(const char* name, cudaStream_t s) {
    if (!on_) return;
    if (marks_.size() == pool_.size()) {
      cudaEvent_t e;
      check(cudaEventCreate(&e), "cudaEventCreate");
      pool_.push_back(e);
    }
    cudaEvent_t e = pool_[marks_.size()];
    check(cudaEventRecord(e, s), "cudaEventRecord");
    marks_.emplace_back(name, e);
  }
  // Waits for the last mark and adds the intervals up.
  void collect() {
    if (!on_ || marks_.empty()) return;
    check(cudaEventSynchronize(marks_.back().second), "cudaEventSynchronize");
    for (size_t i = 1; i < marks_.size(); ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second),
            "cudaEventElapsedTime");
      Stat& st = ms_[marks_[i].first];
      st.total += ms;
      st.calls += 1;
      st.min = std::min(st.min, static_cast<double>(ms));
      st.max = std::max(st.max, static_cast<double>(ms));
    }
    marks_.clear();
  }
  std::string report() const {
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (const auto& [name, st] : ms_) {
      rows.emplace_back(st.total, name);
      total += st.total;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::string out = "  total ms      %  calls   min ms   max ms  operation\n";
    char line[200];
    for (const auto& [ms, name] : rows) {
      const Stat& st = ms_.at(name);
      std::snprintf(line, sizeof line, "%10.3f %6.1f %6d %8.3f %8.3f  %s\n", ms, 100 * ms / total,
                    st.calls, st.min, st.max, name.c_str());
      out += line;
    }
    return out;
  }

 private:
  bool on_;
  std::vector<cudaEvent_t> pool_;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;
  struct Stat {
    double total = 0, min = 1e30, max = 0;
    int calls = 0;
  };
  std::map<std::string, Stat> ms_;
};

}  // namespace

struct Gpt::Impl {
  virtual ~Impl() = default;
  virtual double forward_backward(const nn::Batch& b, const nn::StepContext& ctx) = 0;
  virtual double evaluate(const nn::Batch& b) = 0;

  Impl(const nn::GPTConfig& c, const nn::ParameterSet& layout, const float* initial,
       const GptOptions& o)
      : cfg(c), opts(o), alloc(o.name, o.memory_limit) {
    check(cudaSetDevice(o.device), "cudaSetDevice");
    stream = std::make_unique<Stream>();
    blas = std::make_unique<Blas>(stream->get());
    numel = layout.numel();
    params = DeviceArray<float>(alloc, numel, MemCategory::Parameters, "params");
    grads = DeviceArray<float>(alloc, numel, MemCategory::Gradients, "grads");
    exp_avg = DeviceArray<float>(alloc, numel, MemCategory::OptimizerState, "adamw.exp_avg");
    exp_avg_sq = DeviceArray<float>(alloc, numel, MemCategory::OptimizerState, "adamw.exp_avg_sq");
    copy_to_device(params.get(), initial, sizeof(float) * static_cast<size_t>(numel), s());
    check(cudaMemsetAsync(grads.get(), 0, grads.bytes(), s()), "cudaMemsetAsync");
    check(cudaMemsetAsync(exp_avg.get(), 0, exp_avg.bytes(), s()), "cudaMemsetAsync");
    check(cudaMemsetAsync(exp_avg_sq.get(), 0, exp_avg_sq.bytes(), s()), "cudaMemsetAsync");
    // The optimizer's segments: every parameter, sorted by offset (padding is in none).
    std::vector<const nn::ParamInfo*> infos;
    for (const nn::ParamInfo& p : layout.infos()) infos.push_back(&p);
    std::sort(infos.begin(), infos.end(),
              [](const nn::ParamInfo* a, const nn::ParamInfo* b) { return a->offset < b->offset; });
    std::vector<int64_t> begin, length;
    std::vector<uint8_t> decay;
    for (const nn::ParamInfo* p : infos) {
      begin.push_back(p->offset);
      length.push_back(p->local_numel());
      decay.push_back(p->weight_decay ? 1 : 0);
    }
    segments = static_cast<int>(begin.size());
    seg_begin = DeviceArray<int64_t>(alloc, segments, MemCategory::OptimizerState, "adamw.begin");
    seg_length = DeviceArray<int64_t>(alloc, segments, MemCategory::OptimizerState, "adamw.length");
    seg_decay = DeviceArray<uint8_t>(alloc, segments, MemCategory::OptimizerState, "adamw.decay");
    copy_to_device(seg_begin.get(), begin.data(), sizeof(int64_t) * begin.size(), s());
    copy_to_device(seg_length.get(), length.data(), sizeof(int64_t) * length.size(), s());
    copy_to_device(seg_decay.get(), decay.data(), decay.size(), s());
  }

  cudaStream_t s() const { return stream->get(); }

  nn::GPTConfig cfg;
  GptOptions opts;
  DeviceAllocator alloc;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Blas> blas;
  int64_t numel = 0;
  DeviceArray<float> params, grads, exp_avg, exp_avg_sq;
  int segments = 0;
  DeviceArray<int64_t> seg_begin, seg_length;
  DeviceArray<uint8_t> seg_decay;
  DeviceArray<double> sums;  // sum and sum_squares scratch (sized by the model)
  int64_t t = 0;
  bool weights_dirty = true;  // the bf16 copy lags the fp32 values
  Profiler prof{opts.profile};
  void mark(const char* name) { prof.mark(name, s()); }
};

namespace {

template <typename Act>
class Model final : public Gpt::Impl {
 public:
  Model(const nn::GPTConfig& c, const nn::ParameterSet& layout, const float* initial,
        const GptOptions& o)
      : Impl(c, layout, initial, o) {
    B_ = o.max_batch;
    T_ = o.seq_len > 0 ? o.seq_len : c.block_size;
    C_ = c.n_embd;
    NH_ = c.n_head;
    hs_ = C_ / NH_;
    V_ = c.vocab_size;
    Vp_ = (V_ + 63) / 64 * 64;  // logits rows padded: aligned leading dimensions for cuBLAS
    L_ = c.n_layer;
    const int64_t M = static_cast<int64_t>(B_) * T_;
    auto off = [&](const std::string& name) { return layout.infos()[layout.index(name)].offset; };
    wte_ = off("wte.weight");
    wpe_ = off("wpe.weight");
    lnf_w_ = off("ln_f.weight");
    lnf_b_ = off("ln_f.bias");
    for (int l = 0; l < L_; ++l) {
      const std::string h = "h." + std::to_string(l) + ".";
      blocks_.push_back(
          {off(h + "ln_1.weight"), off(h + "ln_1.bias"), off(h + "attn.c_attn.weight"),
           off(h + "attn.c_attn.bias"), off(h + "attn.c_proj.weight"), off(h + "attn.c_proj.bias"),
           off(h + "ln_2.weight"), off(h + "ln_2.bias"), off(h + "mlp.c_fc.weight"),
           off(h + "mlp.c_fc.bias"), off(h + "mlp.c_proj.weight"), off(h + "mlp.c_proj.bias")});
      site_attn_.push_back(stable_hash(h + "attn.attn_dropout"));
      site_resid_.push_back(stable_hash(h + "attn.resid_dropout"));
      site_mlp_.push_back(stable_hash(h + "mlp.dropout"));
    }
    if constexpr (std::is_same_v<Act, bf16>) {
      weights16_ = DeviceArray<bf16>(alloc, numel, MemCategory::Parameters, "params.bf16");
      // The head's bf16 wte with zero rows up to Vp: the LM head's products run on a vocabulary
      // padded to a multiple of 64 (cuBLAS's kernels for an odd extent are several times slower;
      // the padded logits are 0, the loss reads the first V, their gradients stay 0).
      head16_ = DeviceArray<bf16>(alloc, int64_t{Vp_} * C_, MemCategory::Parameters, "wte.bf16");
      check(cudaMemsetAsync(head16_.get(), 0, head16_.bytes(), s()), "cudaMemsetAsync");
      dhead_ = DeviceArray<float>(alloc, int64_t{Vp_} * C_, MemCategory::Buffers, "scratch.dwte");
      Vh_ = Vp_;
    } else {
      Vh_ = V_;
    }
    const int64_t BH = static_cast<int64_t>(B_) * NH_, TT = static_cast<int64_t>(T_) * T_;
    const bool drop = c.dropout > 0.0f;
    auto act = [&](int64_t n, const std::string& tag) {
      return DeviceArray<Act>(alloc, n, MemCategory::Activations, tag);
    };
    auto stat = [&](const std::string& tag) {
      return DeviceArray<float>(alloc, M, MemCategory::Activations, tag);
    };
    for (int l = 0; l < L_; ++l) {
      const std::string h = "h." + std::to_string(l) + ".";
      BlockActs<Act> a;
      a.ln1 = act(M * C_, h + "ln_1");
      a.ln1_mean = stat(h + "ln_1.mean");
      a.ln1_rstd = stat(h + "ln_1.rstd");
      a.qkv = act(M * 3 * C_, h + "attn.qkv");
      a.q = act(M * C_, h + "attn.q");
      a.k = act(M * C_, h + "attn.k");
      a.v = act(M * C_, h + "attn.v");
      a.att = act(BH * TT, h + "attn.probabilities");
      if (drop) a.att_drop = act(BH * TT, h + "attn.dropped_probabilities");
      a.atty = act(M * C_, h + "attn.atty");
      a.mid = act(M * C_, h + "residual.mid");
      a.ln2 = act(M * C_, h + "ln_2");
      a.ln2_mean = stat(h + "ln_2.mean");
      a.ln2_rstd = stat(h + "ln_2.rstd");
      a.fch = act(M * 4 * C_, h + "mlp.c_fc");
      a.fcg = act(M * 4 * C_, h + "mlp.gelu");
      acts_.push_back(std::move(a));
    }
    for (int l = 0; l <= L_; ++l) res_.push_back(act(M * C_, "residual." + std::to_string(l)));
    lnf_ = act(M * C_, "ln_f");
    lnf_mean_ = stat("ln_f.mean");
    lnf_rstd_ = stat("ln_f.rstd");
    logits_ = act(M * Vp_, "logits");
    losses_ = stat("losses");
    tokens_ = DeviceArray<int32_t>(alloc, M, MemCategory::Buffers, "tokens");
    targets_ = DeviceArray<int32_t>(alloc, M, MemCategory::Buffers, "targets");
    // The backward's scratch, shared by the layers.
    y_ = act(M * C_, "scratch.y");
    tmp_ = act(M * C_, "scratch.branch");
    dres_ = act(M * C_, "scratch.dresidual");
    dln_ = act(M * C_, "scratch.dln");
    dbig_ = act(M * 4 * C_, "scratch.dmlp");
    dqkv_ = act(M * 3 * C_, "scratch.dqkv");
    dq_ = act(M * C_, "scratch.dq");
    dk_ = act(M * C_, "scratch.dk");
    dv_ = act(M * C_, "scratch.dv");
    datt_ = act(BH * TT, "scratch.datt");
    const int64_t red = std::max({layernorm_backward_scratch(static_cast<int>(M), C_),
                                  column_sum_scratch(M, 4 * C_), column_sum_scratch(M, 3 * C_)});
    reduce_ = DeviceArray<float>(alloc, red, MemCategory::Buffers, "scratch.reductions");
    sums = DeviceArray<double>(alloc, sum_squares_scratch(std::max<int64_t>(numel, M)),
                               MemCategory::Buffers, "scratch.sums");
  }

  double forward_backward(const nn::Batch& b, const nn::StepContext& ctx) override {
    TESSERA_CHECK_AS(ShapeError, b.targets != nullptr, "a training micro-batch without targets");
    const float p = ctx.training ? cfg.dropout : 0.0f;
    prof.start(s());
    upload(b);
    mark("upload");
    forward(b, p, ctx);
    const int64_t M = static_cast<int64_t>(b.B) * b.T;
    softmax_xent_forward_backward(logits_.get(), losses_.get(), targets_.get(), ctx.loss_scale,
                                  static_cast<int>(M), V_, s(), Vp_);
    mark("loss (forward and backward)");
    backward(b, p, ctx);
    // Read after the backward is queued: the host waits once, at the end.
    const double loss = sum(losses_.get(), M, sums.get(), s());
    prof.collect();
    return loss;
  }

  double evaluate(const nn::Batch& b) override {
    TESSERA_CHECK_AS(ShapeError, b.targets != nullptr, "an evaluation batch without targets");
    upload(b);
    forward(b, 0.0f, {});
    const int64_t M = static_cast<int64_t>(b.B) * b.T;
    softmax_xent_forward(losses_.get(), logits_.get(), targets_.get(), static_cast<int>(M), V_, s(),
                         Vp_);
    return sum(losses_.get(), M, sums.get(), s());
  }

 private:
  // The GEMM weights as the products read them: the fp32 values, or their bf16 copy.
  const Act* w(int64_t offset) const {
    if constexpr (std::is_same_v<Act, bf16>)
      return weights16_.get() + offset;
    else
      return params.get() + offset;
  }
  const float* pv(int64_t offset) const { return params.get() + offset; }
  // The head's weights, [Vh_, C]: wte, or its bf16 copy padded to Vp rows.
  const Act* head() const {
    if constexpr (std::is_same_v<Act, bf16>)
      return head16_.get();
    else
      return params.get() + wte_;
  }
  float* g(int64_t offset) const { return grads.get() + offset; }

  void upload(const nn::Batch& b) {
    TESSERA_CHECK_AS(ShapeError, b.B >= 1 && b.B <= B_ && b.T >= 1 && b.T <= T_,
                     "a micro-batch of ", b.B, " x ", b.T, " tokens on a device model built for ",
                     B_, " x ", T_);
    TESSERA_CHECK_AS(ShapeError, !b.split(), "context parallelism on the device is not built yet");
    const int64_t M = static_cast<int64_t>(b.B) * b.T;
    for (int64_t i = 0; i < M; ++i) {
      TESSERA_CHECK_AS(ShapeError, b.tokens[i] >= 0 && b.tokens[i] < V_, "token id ", b.tokens[i],
                       " at position ", i, " lies outside the vocabulary of ", V_);
      TESSERA_CHECK_AS(ShapeError, b.targets[i] >= -1 && b.targets[i] < V_, "target id ",
                       b.targets[i], " at position ", i, " lies outside the vocabulary of ", V_);
    }
    copy_to_device(tokens_.get(), b.tokens, sizeof(int32_t) * static_cast<size_t>(M), s());
    copy_to_device(targets_.get(), b.targets, sizeof(int32_t) * static_cast<size_t>(M), s());
    if constexpr (std::is_same_v<Act, bf16>) {
      if (weights_dirty) {
        convert(weights16_.get(), params.get(), numel, s());
        convert(head16_.get(), params.get() + wte_, int64_t{V_} * C_, s());
      }
    }
    weights_dirty = false;
  }

  // out[M, N] = in[M, K] . W[K, N], the bias left to the pass after it.
  void product(Act* out, const Act* in, int64_t W, int M, int K, int N, const char* name) {
    gemm<Act, Act>(*blas, false, false, M, N, K, 1.0f, in, K, w(W), N, 0.0f, out, N);
    mark(name);
  }
  // A residual branch's end: out = residual + dropout(in . W + bias) ([M, C]); without dropout
  // the bias and the residual in one pass.
  void branch_output(Act* out, const Act* residual, const Act* in, int64_t W, int64_t bias, int M,
                     int K, float p, const nn::StepContext& ctx, uint64_t site, int64_t row0,
                     const char* name) {
    product(tmp_.get(), in, W, M, K, C_, name);
    if (p > 0.0f) {
      add_bias(tmp_.get(), pv(bias), M, C_, s());
      dropout_forward(tmp_.get(), tmp_.get(), M, C_, p, ctx.seed, mix_stream(ctx.step, site), row0,
                      s());
      residual_forward(out, residual, tmp_.get(), int64_t{M} * C_, s());
    } else {
      bias_residual_forward(out, tmp_.get(), pv(bias), residual, M, C_, s());
    }
    mark("bias, dropout and residual");
  }
  // din[M, K] = dout . W^T (null: skipped); dW += in^T . dout; dbias += column sums of dout.
  void linear_backward(Act* din, const Act* dout, const Act* in, int64_t W, int64_t bias, int M,
                       int K, int N, const char* name) {
    gemm<Act, float>(*blas, true, false, K, N, M, 1.0f, in, K, dout, N, 1.0f, g(W), N);
    mark(name);
    bias_backward(g(bias), dout, M, N, reduce_.get(), s());
    mark("bias gradients");
    if (din != nullptr)
      gemm<Act, Act>(*blas, false, true, M, K, N, 1.0f, dout, N, w(W), N, 0.0f, din, K);
    mark(name);
  }

  // The gradient of a residual branch's output: dres through the branch's dropout.
  const Act* branch_grad(float p, const nn::StepContext& ctx, uint64_t site, int M, int64_t row0) {
    if (p == 0.0f) return dres_.get();
    dropout_backward(tmp_.get(), dres_.get(), M, C_, p, ctx.seed, mix_stream(ctx.step, site), row0,
                     s());
    return tmp_.get();
  }

  uint64_t first_row(const nn::Batch& b) const {
    return static_cast<uint64_t>(b.first_sample) * b.T;
  }

  void forward(const nn::Batch& b, float p, const nn::StepContext& ctx) {
    const int B = b.B, T = b.T, M = B * T, C = C_;
    const int64_t BH = static_cast<int64_t>(B) * NH_, TT = static_cast<int64_t>(T) * T;
    const int64_t row0 = static_cast<int64_t>(first_row(b));
    const float eps = cfg.ln_eps, scale = 1.0f / std::sqrt(static_cast<float>(hs_));
    embedding_forward(res_[0].get(), tokens_.get(), pv(wte_), pv(wpe_), B, T, C, s());
    if (p > 0.0f)
      dropout_forward(res_[0].get(), res_[0].get(), M, C, p, ctx.seed,
                      mix_stream(ctx.step, stable_hash("drop")), row0, s());
    mark("embedding");
    for (int l = 0; l < L_; ++l) {
      const BlockParams& P = blocks_[l];
      BlockActs<Act>& a = acts_[l];
      layernorm_forward(a.ln1.get(), a.ln1_mean.get(), a.ln1_rstd.get(), res_[l].get(), pv(P.ln1_w),
                        pv(P.ln1_b), M, C, eps, s());
      mark("layernorm");
      product(a.qkv.get(), a.ln1.get(), P.qkv_w, M, C, 3 * C, "c_attn");
      // The c_attn bias joins on the way to the heads (qkv itself is not read again).
      split_qkv_heads(a.q.get(), a.k.get(), a.v.get(), a.qkv.get(), B, T, NH_, hs_, s(),
                      pv(P.qkv_b));
      mark("attention heads (split, merge)");
      // scores[bh] = q k^T ([T, hs] . [hs, T]), then the causal softmax in place.
      gemm_batched<Act, Act>(*blas, false, true, T, T, hs_, 1.0f, a.q.get(), hs_, int64_t{T} * hs_,
                             a.k.get(), hs_, int64_t{T} * hs_, 0.0f, a.att.get(), T, TT,
                             static_cast<int>(BH));
      mark("attention products");
      const AttnDropout ad{p, ctx.seed, mix_stream(ctx.step, site_attn_[l]), b.first_sample};
      causal_softmax_forward(a.att.get(), p > 0.0f ? a.att_drop.get() : nullptr, a.att.get(), B,
                             NH_, T, scale, ad, s());
      mark("attention softmax");
      const Act* probs = p > 0.0f ? a.att_drop.get() : a.att.get();
      gemm_batched<Act, Act>(*blas, false, false, T, hs_, T, 1.0f, probs, T, TT, a.v.get(), hs_,
                             int64_t{T} * hs_, 0.0f, y_.get(), hs_, int64_t{T} * hs_,
                             static_cast<int>(BH));
      mark("attention products");
      merge_heads(a.atty.get(), y_.get(), B, T, NH_, hs_, s());
      mark("attention heads (split, merge)");
      branch_output(a.mid.get(), res_[l].get(), a.atty.get(), P.proj_w, P.proj_b, M, C, p, ctx,
                    site_resid_[l], row0, "attn.c_proj");
      layernorm_forward(a.ln2.get(), a.ln2_mean.get(), a.ln2_rstd.get(), a.mid.get(), pv(P.ln2_w),
                        pv(P.ln2_b), M, C, eps, s());
      mark("layernorm");
      product(a.fch.get(), a.ln2.get(), P.fc_w, M, C, 4 * C, "c_fc");
      gelu_bias_forward(a.fch.get(), a.fcg.get(), pv(P.fc_b), M, 4 * C, s());
      mark("gelu (with the c_fc bias)");
      branch_output(res_[l + 1].get(), a.mid.get(), a.fcg.get(), P.fcproj_w, P.fcproj_b, M, 4 * C,
                    p, ctx, site_mlp_[l], row0, "mlp.c_proj");
    }
    layernorm_forward(lnf_.get(), lnf_mean_.get(), lnf_rstd_.get(), res_[L_].get(), pv(lnf_w_),
                      pv(lnf_b_), M, C, eps, s());
    mark("layernorm");
    // Tied head: logits[M, V] = ln_f . wte^T.
    gemm<Act, Act>(*blas, false, true, M, Vh_, C, 1.0f, lnf_.get(), C, head(), C, 0.0f,
                   logits_.get(), Vp_);
    mark("lm head");
  }

  // Runs after the forward and the loss's backward (logits_ holds dL/dlogits).
  void backward(const nn::Batch& b, float p, const nn::StepContext& ctx) {
    const int B = b.B, T = b.T, M = B * T, C = C_;
    const int64_t BH = static_cast<int64_t>(B) * NH_, TT = static_cast<int64_t>(T) * T;
    const int64_t row0 = static_cast<int64_t>(first_row(b));
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs_));
    // Head: dwte += dlogits^T . ln_f; dln_f = dlogits . wte.
    if (Vh_ == V_) {
      gemm<Act, float>(*blas, true, false, V_, C, M, 1.0f, logits_.get(), Vp_, lnf_.get(), C, 1.0f,
                       g(wte_), C);
    } else {  // the padded vocabulary's rows into scratch, then the first V into the gradient
      gemm<Act, float>(*blas, true, false, Vh_, C, M, 1.0f, logits_.get(), Vp_, lnf_.get(), C, 0.0f,
                       dhead_.get(), C);
      accumulate(g(wte_), dhead_.get(), int64_t{V_} * C, s());
    }
    gemm<Act, Act>(*blas, false, false, M, C, Vh_, 1.0f, logits_.get(), Vp_, head(), C, 0.0f,
                   dln_.get(), C);
    mark("lm head backward");
    check(cudaMemsetAsync(dres_.get(), 0, sizeof(Act) * static_cast<size_t>(M) * C, s()),
          "cudaMemsetAsync");
    layernorm_backward(dres_.get(), g(lnf_w_), g(lnf_b_), dln_.get(), res_[L_].get(), pv(lnf_w_),
                       lnf_mean_.get(), lnf_rstd_.get(), M, C, reduce_.get(), s());
    mark("layernorm backward");
    for (int l = L_ - 1; l >= 0; --l) {
      const BlockParams& P = blocks_[l];
      BlockActs<Act>& a = acts_[l];
      // MLP half: dres is dL/d(block output) = dL/d(mid) through the residual.
      linear_backward(dbig_.get(), branch_grad(p, ctx, site_mlp_[l], M, row0), a.fcg.get(),
                      P.fcproj_w, P.fcproj_b, M, 4 * C, C, "mlp.c_proj backward");
      gelu_backward(dbig_.get(), dbig_.get(), a.fch.get(), int64_t{M} * 4 * C, s());
      mark("gelu backward");
      linear_backward(dln_.get(), dbig_.get(), a.ln2.get(), P.fc_w, P.fc_b, M, C, 4 * C,
                      "c_fc backward");
      layernorm_backward(dres_.get(), g(P.ln2_w), g(P.ln2_b), dln_.get(), a.mid.get(), pv(P.ln2_w),
                         a.ln2_mean.get(), a.ln2_rstd.get(), M, C, reduce_.get(), s());
      mark("layernorm backward");
      // Attention half: dres is now dL/d(mid).
      linear_backward(dln_.get(), branch_grad(p, ctx, site_resid_[l], M, row0), a.atty.get(),
                      P.proj_w, P.proj_b, M, C, C, "attn.c_proj backward");
      split_heads(y_.get(), dln_.get(), B, T, NH_, hs_, s());  // dy[B, NH, T, hs]
      mark("attention heads backward");
      const Act* probs = p > 0.0f ? a.att_drop.get() : a.att.get();
      const int64_t THS = int64_t{T} * hs_;
      const int bh = static_cast<int>(BH);
      // datt = dy v^T; dv = probs^T dy.
      gemm_batched<Act, Act>(*blas, false, true, T, T, hs_, 1.0f, y_.get(), hs_, THS, a.v.get(),
                             hs_, THS, 0.0f, datt_.get(), T, TT, bh);
      gemm_batched<Act, Act>(*blas, true, false, T, hs_, T, 1.0f, probs, T, TT, y_.get(), hs_, THS,
                             0.0f, dv_.get(), hs_, THS, bh);
      mark("attention products backward");
      const AttnDropout ad{p, ctx.seed, mix_stream(ctx.step, site_attn_[l]), b.first_sample};
      causal_softmax_backward(datt_.get(), datt_.get(), a.att.get(), B, NH_, T, scale, ad, s());
      mark("attention softmax backward");
      // dq = dscores k; dk = dscores^T q.
      gemm_batched<Act, Act>(*blas, false, false, T, hs_, T, 1.0f, datt_.get(), T, TT, a.k.get(),
                             hs_, THS, 0.0f, dq_.get(), hs_, THS, bh);
      gemm_batched<Act, Act>(*blas, true, false, T, hs_, T, 1.0f, datt_.get(), T, TT, a.q.get(),
                             hs_, THS, 0.0f, dk_.get(), hs_, THS, bh);
      mark("attention products backward");
      merge_qkv_heads(dqkv_.get(), dq_.get(), dk_.get(), dv_.get(), B, T, NH_, hs_, s());
      mark("attention heads backward");
      linear_backward(dln_.get(), dqkv_.get(), a.ln1.get(), P.qkv_w, P.qkv_b, M, C, 3 * C,
                      "c_attn backward");
      layernorm_backward(dres_.get(), g(P.ln1_w), g(P.ln1_b), dln_.get(), res_[l].get(),
                         pv(P.ln1_w), a.ln1_mean.get(), a.ln1_rstd.get(), M, C, reduce_.get(), s());
      mark("layernorm backward");
    }
    if (p > 0.0f)
      dropout_backward(dres_.get(), dres_.get(), M, C, p, ctx.seed,
                       mix_stream(ctx.step, stable_hash("drop")), row0, s());
    embedding_backward(g(wte_), g(wpe_), dres_.get(), tokens_.get(), B, T, C, s());
    mark("embedding backward");
  }

  int B_ = 0, T_ = 0, C_ = 0, NH_ = 0, hs_ = 0, V_ = 0, Vp_ = 0, Vh_ = 0, L_ = 0;
  int64_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
  std::vector<BlockParams> blocks_;
  std::vector<uint64_t> site_attn_, site_resid_, site_mlp_;
  DeviceArray<bf16> weights16_, head16_;
  std::vector<BlockActs<Act>> acts_;
  std::vector<DeviceArray<Act>> res_;
  DeviceArray<Act> lnf_, logits_, y_, tmp_, dres_, dln_, dbig_, dqkv_, dq_, dk_, dv_, datt_;
  DeviceArray<float> lnf_mean_, lnf_rstd_, losses_, reduce_, dhead_;
  DeviceArray<int32_t> tokens_, targets_;
};

void check_supported(const nn::GPTConfig& c, const nn::ParameterSet& layout) {
  nn::validate(c);
  TESSERA_CHECK_AS(ConfigError, !c.llama(),
                   "--device cuda trains GPT-2 models only so far (the Llama family runs on cpu)");
  TESSERA_CHECK_AS(ConfigError, !c.moe.enabled(),
                   "--device cuda does not run mixtures of experts yet (use --device cpu)");
  for (const nn::ParamInfo& p : layout.infos())
    TESSERA_CHECK_AS(ConfigError, p.tp_replicated(), "--device cuda takes a whole model: ", p.name,
                     " is a tensor-parallel shard");
}

}  // namespace

Gpt::Gpt(const nn::GPTConfig& cfg, const nn::ParameterSet& layout, const float* initial,
         const GptOptions& opts) {
  check_supported(cfg, layout);
  TESSERA_CHECK_AS(ConfigError, opts.max_batch >= 1, "the device model needs max_batch >= 1");
  TESSERA_CHECK_AS(ConfigError, opts.seq_len >= 0 && opts.seq_len <= cfg.block_size,
                   "sequence length ", opts.seq_len, " exceeds block_size ", cfg.block_size);
  if (opts.precision == Precision::F32)
    impl_ = std::make_unique<Model<float>>(cfg, layout, initial, opts);
  else
    impl_ = std::make_unique<Model<bf16>>(cfg, layout, initial, opts);
}

Gpt::~Gpt() = default;

double Gpt::forward_backward(const nn::Batch& b, const nn::StepContext& ctx) {
  return impl_->forward_backward(b, ctx);
}
double Gpt::evaluate(const nn::Batch& b) {
  return impl_->evaluate(b);
}

void Gpt::zero_grads() {
  check(cudaMemsetAsync(impl_->grads.get(), 0, impl_->grads.bytes(), impl_->s()),
        "cudaMemsetAsync");
}

double Gpt::grad_sum_squares() {
  impl_->prof.start(impl_->s());
  const double r = sum_squares(impl_->grads.get(), impl_->numel, impl_->sums.get(), impl_->s());
  impl_->mark("gradient norm");
  impl_->prof.collect();
  return r;
}

void Gpt::scale_grads(float s) {
  scale(impl_->grads.get(), impl_->numel, s, impl_->s());
}

void Gpt::adamw_step(const optim::AdamWConfig& cfg, float lr) {
  Impl& m = *impl_;
  ++m.t;
  AdamwArgs a;
  a.lr = lr;
  a.beta1 = cfg.beta1;
  a.beta2 = cfg.beta2;
  a.eps = cfg.eps;
  a.weight_decay = cfg.weight_decay;
  a.t = m.t;
  m.prof.start(m.s());
  cuda::adamw_step(m.params.get(), m.exp_avg.get(), m.exp_avg_sq.get(), m.grads.get(),
                   m.seg_begin.get(), m.seg_length.get(), m.seg_decay.get(), m.segments, m.numel, a,
                   m.s());
  m.mark("adamw");
  m.prof.collect();
  m.weights_dirty = true;
}

int64_t Gpt::steps() const {
  return impl_->t;
}
int64_t Gpt::numel() const {
  return impl_->numel;
}
std::vector<float> Gpt::params() const {
  return to_host(impl_->params.get(), impl_->numel, impl_->s());
}
std::vector<float> Gpt::grads() const {
  return to_host(impl_->grads.get(), impl_->numel, impl_->s());
}
float* Gpt::device_params() {
  return impl_->params.get();
}
float* Gpt::device_grads() {
  return impl_->grads.get();
}
void Gpt::set_grads(const float* host) {
  copy_to_device(impl_->grads.get(), host, impl_->grads.bytes(), impl_->s());
}
void Gpt::set_params(const float* host) {
  copy_to_device(impl_->params.get(), host, impl_->params.bytes(), impl_->s());
  impl_->weights_dirty = true;
}
void Gpt::get_params(float* host) const {
  copy_to_host(host, impl_->params.get(), impl_->params.bytes(), impl_->s());
}
void Gpt::set_optimizer_state(const float* exp_avg, const float* exp_avg_sq, int64_t steps) {
  copy_to_device(impl_->exp_avg.get(), exp_avg, impl_->exp_avg.bytes(), impl_->s());
  copy_to_device(impl_->exp_avg_sq.get(), exp_avg_sq, impl_->exp_avg_sq.bytes(), impl_->s());
  impl_->t = steps;
}
void Gpt::get_optimizer_state(float* exp_avg, float* exp_avg_sq) const {
  copy_to_host(exp_avg, impl_->exp_avg.get(), impl_->exp_avg.bytes(), impl_->s());
  copy_to_host(exp_avg_sq, impl_->exp_avg_sq.get(), impl_->exp_avg_sq.bytes(), impl_->s());
}
std::string Gpt::profile() const {
  return impl_->prof.report();
}
const nn::GPTConfig& Gpt::config() const {
  return impl_->cfg;
}
Precision Gpt::precision() const {
  return impl_->opts.precision;
}
DeviceAllocator& Gpt::allocator() {
  return impl_->alloc;
}
cudaStream_t Gpt::stream() const {
  return impl_->s();
}
void Gpt::synchronize() const {
  impl_->stream->synchronize();
}

}  // namespace tessera::cuda
