// GPT-2 on one GPU: a rank's whole model (forward, backward, AdamW) on the device, in fp32 or in
// bf16, with the CPU model's parameter layout, initialisation, dropout streams and loss, so that a
// GPU rank trains what a CPU rank trains (docs/ARCHITECTURE.md, decision 43).
//
// Layout: the parameters, their gradients and the optimizer state are the CPU ParameterSet's flat
// buffers (same names, offsets and alignment padding) in device memory, so a data-parallel
// exchange, a comparison or a checkpoint moves one flat range. Activations are of the precision's
// type: fp32, or bf16 with every product on the tensor cores (fp32 accumulation) and the fp32
// master weights converted into a bf16 copy once per step. Attention materialises the causal
// [B, heads, T, T] probabilities (cuBLAS batched products around a fused softmax); the fused
// FlashAttention kernel of the CPU path is not ported yet.
//
// Dropout: the CPU model's sites and streams, mix_stream(step, stable_hash(site)), drawn at
// global coordinates (kernels/dropout.h), so masks are bitwise the CPU's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/cuda/runtime.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/parameters.h"
#include "tessera/optim/adamw.h"

namespace tessera::cuda {

enum class Precision { F32, BF16 };
Precision parse_precision(const std::string& s);  // "fp32" | "bf16", else ConfigError
const char* to_string(Precision p);

struct GptOptions {
  Precision precision = Precision::F32;
  int max_batch = 1;        // rows of a micro-batch (B)
  int seq_len = 0;          // T; 0: block_size
  size_t memory_limit = 0;  // bytes of device memory this rank may hold (0: the device's)
  std::string name = "cuda rank 0";
  int device = 0;
  // Time every operation of a step with CUDA events (Gpt::profile()): a breakdown for tuning;
  // the events cost a little time of their own.
  bool profile = false;
};

class Gpt {
 public:
  // GPT-2 of `cfg` with `layout`'s parameters (a CPU model's ParameterSet of the same config,
  // materialised with full buffers: names, offsets, weight decay) and initial values `initial`
  // (host, layout.numel() floats, padding included). ConfigError for what the device path does
  // not run yet (the Llama family, mixtures of experts, a sharded layout).
  Gpt(const nn::GPTConfig& cfg, const nn::ParameterSet& layout, const float* initial,
      const GptOptions& opts);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  // Forward and backward of micro-batch b (host tokens and targets [B, T]); parameter gradients
  // ACCUMULATE into the flat gradient buffer. Returns the sum of the micro-batch's token losses
  // (unscaled; the gradients carry ctx.loss_scale).
  double forward_backward(const nn::Batch& b, const nn::StepContext& ctx);
  // Forward alone (evaluation: no dropout whatever ctx says): the sum of the token losses.
  double evaluate(const nn::Batch& b);

  void zero_grads();
  double grad_sum_squares();
  void scale_grads(float s);
  // One AdamW step (the step counter advances first, as optim::AdamW::step).
  void adamw_step(const optim::AdamWConfig& cfg, float lr);
  int64_t steps() const;

  int64_t numel() const;  // flat elements, padding included
  std::vector<float> params() const;
  std::vector<float> grads() const;
  // Device pointers of the flat fp32 buffers (for a host-staged or NCCL exchange).
  float* device_params();
  float* device_grads();
  // Copies host values into the flat gradient buffer (after a host-staged all-reduce).
  void set_grads(const float* host);
  // The flat parameters (numel() floats) from and to host memory (a checkpoint's values).
  void set_params(const float* host);
  void get_params(float* host) const;
  // AdamW's state, laid out like the flat buffer, and its step count.
  void set_optimizer_state(const float* exp_avg, const float* exp_avg_sq, int64_t steps);
  void get_optimizer_state(float* exp_avg, float* exp_avg_sq) const;

  // With GptOptions::profile: milliseconds per operation kind summed over the steps so far, the
  // largest first, one line each ("  12.345 ms  attention.softmax").
  std::string profile() const;

  const nn::GPTConfig& config() const;
  Precision precision() const;
  DeviceAllocator& allocator();
  cudaStream_t stream() const;
  void synchronize() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::cuda
