// GPT-2 hyper-parameters and the per-step inputs of the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/kernels/rope.h"

namespace tessera::nn {

// The building blocks of a model (docs/ARCHITECTURE.md decision 39). Gpt2: learned positions,
// LayerNorm, fused c_attn, GELU MLP of 4C, head tied to wte, Hugging Face GPT2Model names. Llama
// (Llama, Mistral, Qwen2): no learned positions, RMSNorm, rotary q/k (kernels/rope.h),
// grouped-query attention with separate q/k/v projections in nn.Linear layout [out, in] (optional
// biases: Qwen2), a SwiGLU MLP of ffn_dim, a tied or untied head, LlamaForCausalLM names; dropout
// only on the attention probabilities (Hugging Face's attention_dropout).
enum class Arch { Gpt2, Llama };
const char* to_string(Arch a);
Arch parse_arch(const std::string& s);  // "gpt2" | "llama", else ConfigError

// Mixture of experts (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch Transformer, Fedus
// et al. 2021): the MLP of some blocks becomes `experts` expert MLPs and a linear router (nn/moe.h,
// docs/ARCHITECTURE.md decision 30): GPT-2 MLPs of 4C for GPT-2, SwiGLU MLPs of their own width
// (ffn_dim) for the Llama family, which may add shared experts that every token passes through
// (Qwen2-MoE, DeepSeekMoE). Block l (0-based) is an MoE block when l % every == every - 1 and l is
// not in dense_layers: every = 1 makes every block MoE, every = 2 blocks 1, 3, 5, ... (GShard's
// and Switch's "every other layer"; Qwen2-MoE's decoder_sparse_step, its mlp_only_layers the
// dense_layers).
enum class RouterScore {
  Softmax,  // p = softmax(logits) (Switch, Mixtral, Qwen2-MoE)
  Sigmoid,  // s = sigmoid(logits) per expert (DeepSeek-V3)
};
const char* to_string(RouterScore s);
RouterScore parse_router_score(const std::string& s);  // "softmax" | "sigmoid", else ConfigError

struct MoeConfig {
  int experts = 0;  // E; 0: every MLP is dense
  int top_k = 2;    // experts per token
  int every = 1;
  std::vector<int> dense_layers{};  // blocks that stay dense whatever `every` says
  // Per-sequence capacity (moe_router.h): 0 = dropless; otherwise each expert takes at most
  // ceil(capacity_factor * top_k * T / E) of a sequence's T tokens.
  float capacity_factor = 0.0f;
  float aux_loss = 0.01f;  // alpha of the Switch load-balancing loss, alpha E sum_i f_i P_i
  float z_loss = 0.001f;   // beta of the router z-loss (ST-MoE), beta mean (logsumexp logits)^2
  RouterScore score = RouterScore::Softmax;
  // The top-k gates divided by their sum (Mixtral; Qwen2-MoE's norm_topk_prob), or the scores as
  // they are.
  bool renormalize = true;
  // The Llama family: the experts' SwiGLU width (0: the dense MLP's, GPTConfig::mlp_hidden()),
  // and one shared expert of shared_ffn_dim (0: none) whose output is scaled by
  // sigmoid(x . w_gate) when shared_gate (Qwen2-MoE's shared_expert_gate).
  int ffn_dim = 0;
  int shared_ffn_dim = 0;
  bool shared_gate = false;
  bool enabled() const { return experts > 0; }
  bool is_moe_layer(int layer) const;
  bool operator==(const MoeConfig&) const = default;
};

struct GPTConfig {
  Arch arch = Arch::Gpt2;
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 256;
  int block_size = 128;  // context length (rows of wpe)
  int vocab_size = 512;
  float ln_eps = 1e-5f;
  // One probability for all of Hugging Face's dropout sites: embeddings ("drop"), attention
  // probabilities ("attn_dropout"), and the two residual branches ("resid_dropout", "mlp.dropout").
  float dropout = 0.0f;
  MoeConfig moe;
  // The Llama family (arch Llama); GPT-2 ignores these.
  int n_kv_head = 0;  // key/value heads (grouped-query attention; 1: multi-query); 0: n_head
  int ffn_dim = 0;    // the SwiGLU MLP's hidden width; 0: Llama's rule (llama_ffn_dim)
  double rope_theta = 10000.0;
  kernels::RopeScaling rope_scaling;  // Llama 3's (factor 0: none)
  bool qkv_bias = false;              // biases on q, k and v (Qwen2)
  bool o_bias = false;                // a bias on the attention output (Llama's attention_bias)
  bool tie_embeddings = true;         // the head reads the token embedding (GPT-2: always)
  int max_positions = 0;   // the positions the model was made for (HF max_position_embeddings); 0:
                           // block_size. Rotary models train and sample at block_size <= this.
  int sliding_window = 0;  // Mistral/Qwen2's window (0: none); block_size must not exceed it
  // "llama", "mistral", "qwen2", "mixtral" or "qwen2_moe": what an export writes (see hf_type()).
  std::string hf_model_type;

  bool llama() const { return arch == Arch::Llama; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_dim() const { return n_embd / n_head; }
  // The MLP's hidden width: 4C for GPT-2; ffn_dim, or Llama's rule, for the Llama family.
  int mlp_hidden() const;
  // An expert's hidden width: 4C for GPT-2; moe.ffn_dim, or mlp_hidden(), for the Llama family.
  int moe_hidden() const;
  // The Hugging Face model type an export writes and whose parameter names the modules take:
  // "gpt2"; for the Llama family hf_model_type (when empty: "qwen2" for biases on q, k and v
  // alone, else "llama"), except that a mixture of
  // experts is "mixtral" or "qwen2_moe" (llama_moe_type).
  std::string hf_type() const;
};

// The Hugging Face family of a Llama-family mixture of experts: the one it was read as ("mixtral"
// or "qwen2_moe"), else "mixtral" when Mixtral expresses it (every block MoE, no shared expert,
// softmax scores, renormalised gates, no attention biases) and "qwen2_moe" otherwise.
std::string llama_moe_type(const GPTConfig& c);

// Llama's default MLP width for a model of width C when none is given: 2/3 of 4C rounded up to a
// multiple of 256, as Meta's reference code computes it (multiple_of = 256).
int llama_ffn_dim(int C);

// Activation recomputation (the seed's re-materialisation; Korthikanti et al. 2022, "Reducing
// Activation Recomputation in Large Transformer Models"):
//   None       every block keeps all its intermediate activations until its backward.
//   Selective  the attention core's output (atty and its log-sum-exp: 4 C / t + 4 heads / t bytes
//              a token) is dropped after the forward and the fused attention reruns from the saved
//              qkv in the backward (Megatron's core-attention recomputation). The attention is
//              fused (kernels/flash_attention.h), so no [B, heads, T, T] probabilities are kept in
//              any mode: selective saves that little, for one more attention forward.
//   Full       a block keeps only its input; its whole forward reruns just before its backward.
// Dropout masks are keyed by global coordinates, so a recomputed mask is the same mask, and
// every mode gives bitwise-identical losses and gradients.
enum class Recompute { None, Selective, Full };
Recompute parse_recompute(const std::string& s);  // "none" | "selective" | "full", else ConfigError
const char* to_string(Recompute r);

// How a context-parallel attention (nn/context_parallel_attention.h, --cp-comm) brings every
// rank's queries together with the keys and values of the whole sequence:
//   AllGather  all-gather K and V over the cp ranks, local queries against every key; dK and dV
//              reduce-scattered back (Llama 3's choice: simplest, any mask)
//   Ring       K and V blocks passed around the ring while the rank computes with the block it
//              holds, results merged by log-sum-exp; dK and dV travel back to their owner
//   Ulysses    all-to-all from sequence-split to head-split (n divides the query heads), the whole
//              sequence's attention on heads / n heads, all-to-all back (DeepSpeed-Ulysses)
enum class CpComm { AllGather, Ring, Ulysses };
CpComm parse_cp_comm(const std::string& s);  // "allgather" | "ring" | "ulysses", else ConfigError
const char* to_string(CpComm c);

// Whether a bf16 model keeps bf16 copies of its GEMM weights (GPTLayout::bf16_weight_copies).
enum class WeightCopies { Auto, Always, Never };
// "auto" | "on" | "off" (--bf16-weight-copies), else a ConfigError naming them.
WeightCopies parse_weight_copies(const std::string& s);
// Whether a bf16 model whose parameters are resident keeps the copies, its GEMMs running through
// oneDNN (onednn) or the emulated path: Auto means through oneDNN, which reads them in place.
bool keeps_weight_copies(WeightCopies w, bool onednn);

// Which part of a block a module (and a pipeline stage) holds: all of it, the attention half
// (ln_1, attn, the first residual add) or the MLP half (ln_2, mlp, the second residual add).
enum class BlockPart { Whole, Attention, Mlp };

// Throws ConfigError naming the offending field: non-positive sizes, heads not dividing the
// width, eps <= 0, dropout outside [0, 1), MoE settings out of range (top_k above the expert
// count, every above the layer count, negative capacity or loss coefficients).
void validate(const GPTConfig& cfg);

// A micro-batch: rows are global samples [first_sample, first_sample + B) of this step's global
// batch (dropout masks are drawn from global coordinates). tokens/targets are [B, T] row-major;
// targets -1 are ignored; targets == nullptr means inference (no loss).
//
// Context parallelism (nn/context_parallel.h): the T rows of each sequence are this rank's share
// of a sequence of seq_len tokens, at the global positions positions[0..T) (the same for every
// sequence); the model's context-parallel group holds the rest. positions null (and seq_len 0 or
// T): whole sequences, positions 0..T-1, nothing exchanged.
struct Batch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int B = 0;
  int T = 0;
  int64_t first_sample = 0;
  int seq_len = 0;                     // the global sequence length (0: T)
  const int64_t* positions = nullptr;  // [T] global positions of the rows (null: 0..T-1)
  int length() const { return seq_len > 0 ? seq_len : T; }
  bool split() const { return positions != nullptr; }  // over the model's cp group
};

struct StepContext {
  uint64_t seed = 0;        // dropout seed
  uint64_t step = 0;        // optimizer step (dropout stream)
  bool training = true;     // false: dropout is the identity
  float loss_scale = 1.0f;  // 1 / global target-token count
};

}  // namespace tessera::nn
