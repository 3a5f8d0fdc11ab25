// The output layer as a module: the final norm (GPT-2's LayerNorm ln_f; the Llama family's RMSNorm
// "model.norm"), the LM head (logits = norm(x) . W^T, W the token embedding it is tied to, or the
// Llama family's untied "lm_head.weight" [V, C]), and the cross-entropy. The caller owns the
// Record.
//
// Tying: when the embedding lives on the same rank, the head reads its wte parameter; on the last
// pipeline stage without the embedding the head registers its own copy of "wte.weight", whose
// gradient the caller sums with the first stage's (Megatron's embedding group) so both copies stay
// equal to one device's.
//
// Vocabulary parallelism (a TensorSplit of t > 1 ranks; wte split by rows as in embedding.h): a
// rank computes the logits of its vocabulary slice only, and the cross-entropy is assembled from
// per-row statistics (all-reduce of the row maxima with max, then one all-reduce of the sums of
// exponentials and of the target logit); the full logits are never gathered. Backward: the local
// dlogits, dwte_local += dlogits^T . ln_f(x), and d ln_f(x) = dlogits . wte_local summed over the
// group (copy_to_tp_backward). There are no padding rows, so a padding logit cannot exist.
//
// Sequence parallelism: the input x and dx hold this rank's rows (token_range); ln_f runs on them
// and its output is all-gathered (gather_to_tp) before the logits, so the loss is computed from
// every token's logits exactly as without it; d ln_f(x) is reduce-scattered back to the rows
// (gather_to_tp_backward), and ln_f's parameter gradients are partial (summed by the engine).
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/tensor.h"
#include "tessera/nn/activations.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/parameters.h"
#include "tessera/nn/tensor_parallel.h"

namespace tessera::nn {

class Head {
 public:
  struct Record {
    Tensor lnf;                 // [B, T, C] (padded rows: all-gathered into place)
    Tensor lnf_mean, lnf_rstd;  // [rows]: this rank's rows
    Tensor logits;              // [B, T, V_local]; the backward turns it into dlogits in place
    Tensor lse, losses;         // [B, T]
    Tensor targets;             // I32 [B, T]
    const float* x = nullptr;   // the head's input, kept alive by the caller
    int B = 0, T = 0;
    bool have_targets = false;
    float loss_scale = 1.0f;
  };

  // Registers the norm; `wte` is the index of the embedding in `ps`, or -1 to register a copy
  // (ignored when cfg.tie_embeddings is false: the head registers lm_head.weight).
  // With a split, wte must be this rank's rows (vocab_shard).
  // Records hold rows_per_sequence rows of each sequence (0: block_size; a context-parallel rank's
  // share: ContextSplit::rows_per_sequence).
  Head(ParameterSet& ps, const GPTConfig& cfg, int wte, TensorSplit split,
       int64_t rows_per_sequence = 0);
  Record make_record(int max_batch, Allocator& alloc,
                     std::vector<NamedActivation>* list = nullptr) const;
  int wte() const { return wte_; }  // the output projection (tied wte, or lm_head)
  // The vocabulary slice whose logits this rank computes (all of it without a split).
  VocabRange vocab() const { return vocab_; }
  // Tied to the token embedding (GPT-2; Llama-family models with tie_word_embeddings); owns_wte:
  // tied, on a stage without the embedding, so it holds a copy the embedding group keeps equal.
  bool tied() const { return tied_; }
  bool owns_wte() const { return owns_wte_; }

  // Logits of x[rows, C] (token_range: all B*T without sequence parallelism); returns the SUM of
  // the token cross-entropies over targets that are not -1 (0 without targets: inference).
  double forward(const StepContext& ctx, const Batch& b, const float* x, Record& r) const;
  // ASSIGNS dx[rows, C] = d(loss_scale * loss sum)/dx and ACCUMULATES the ln_f and wte
  // gradients. scratch: token_range(B*T).padded() x C floats of workspace.
  // defer_weights (zero-bubble BI): the tied wte's gradient waits for backward_weight(r) (W),
  // which reads the logits' gradient and ln_f's output kept in r.
  void backward(Record& r, float* dx, float* scratch, bool defer_weights = false) const;
  void backward_weight(const Record& r) const;
  // Generation with a key/value cache (GPT::decode; no tensor parallelism): ASSIGNS logits[rows, V]
  // of x[rows, C] (the norm, then the LM head), as forward computes them. norm: rows x C floats of
  // scratch; mean, rstd: rows each (mean unused by an RMSNorm).
  void decode(const float* x, int64_t rows, float* logits, float* norm, float* mean,
              float* rstd) const;

 private:
  const ParameterSet& ps_;
  GPTConfig cfg_;
  TensorSplit split_;
  VocabRange vocab_;
  int64_t rows_per_sequence_;
  int wte_, lnf_w_ = -1, lnf_b_ = -1;  // lnf_b_ -1: an RMSNorm
  bool tied_, owns_wte_;
};

}  // namespace tessera::nn
