// The router of a mixture-of-experts layer as free functions on raw buffers (fp32), one
// micro-batch of B sequences x T tokens (N = B T rows), E experts, top-k:
//
//   logits = x . W_router                       [N, E]  (a linear router, no bias)
//   scores: softmax (Switch, Mixtral, Qwen2-MoE)  p = softmax(logits), the scores themselves
//           sigmoid (DeepSeek-V3)                 s = sigmoid(logits) per expert, p = s / sum s
//   lse = logsumexp(logits)                      [N]     (the z-loss, whatever the scores)
//   the k largest scores (+ a per-expert selection bias b, if any) of each token, descending;
//   ties go to the lower expert index
//   gate_j = s_{e_j} / sum_{j'} s_{e_j'}         renormalised over the k chosen experts, or
//   gate_j = s_{e_j}                             (renormalize false: Qwen2-MoE's norm_topk_prob)
//
// The selection bias is auxiliary-loss-free load balancing (DeepSeek-V3, Wang et al. 2024): it
// moves which experts a token is sent to, never the gates (so it gets no gradient); the trainer
// updates it after each optimizer step (train/moe_bias.h).
//
// Capacity (docs/ARCHITECTURE.md, decision 30). Switch Transformer (Fedus et al. 2021) gives each
// expert capacity = capacity_factor x tokens_per_batch / E, where the batch is what one device
// holds, so which tokens are dropped depends on the device batch, i.e. on the layout. GShard
// (Lepikhin et al. 2020) computes it per group of S tokens (2S/E for top-2) and fills it by
// position, first choices before second choices. tessera takes GShard's rule with the group
// fixed to one sequence, which no layout splits:
//   capacity = ceil(capacity_factor x k x T / E)   assignments per expert and sequence
// and an expert keeps, within each sequence, the assignments (t, j) in the order (j, t): every
// token's first choice in position order, then every second choice, ...; the rest are dropped
// (their gate contributes nothing; the token keeps its residual and its other experts). So the
// dropped set depends only on the sequence itself. capacity_factor 0 = dropless.
//
// Auxiliary losses, per sequence s of T tokens (f counted from the router's choices, before
// capacity; p the softmax probabilities, or the normalised sigmoid scores as DeepSeek-V3's
// sequence-wise balance loss takes them):
//   f_si = (1 / (T k)) #{(t, j) in s : e_tj = i},   P_si = (1 / T) sum_{t in s} p_ti
//   balance_s = E sum_i f_si P_si               (Switch's load-balancing loss; 1 when uniform)
//   z_t = lse_t^2                               (ST-MoE's router z-loss, Zoph et al. 2022)
// The objective adds, like the cross-entropy, per token weight loss_scale (1 / global tokens):
//   aux_loss x loss_scale x T x sum_s balance_s + z_loss x loss_scale x sum_t z_t
// i.e. alpha mean_s balance_s + beta mean_t z_t over the global batch. Both decompose over
// sequences, so micro-batches and ranks add up to the same objective.
//
// Context parallelism (nn/context_parallel.h) splits a sequence over ranks. f_si then counts the
// whole sequence's choices (the ranks share them: MixtureOfExperts::forward) and T is the whole
// sequence's length, while each rank sums P over its own tokens: balance_s = E sum_i f_si P_si is
// linear in P given f, so the ranks' parts add up to it, and d balance / d p_ti is each rank's own.
// The functions below take the sequences' counts (`counts`, [B, E]: choices per expert of each
// whole sequence) and its length (`seq_len`) for that; null / 0: count this rank's choices, T.
#pragma once

#include <cstdint>

#include "tessera/nn/gpt_config.h"

namespace tessera::nn {

// ASSIGNS probs[N, E] = softmax(logits) row-wise and lse[N] = logsumexp of each row.
void router_softmax(float* probs, float* lse, const float* logits, int64_t N, int E);

// ASSIGNS scores[N, E] = sigmoid(logits), probs[N, E] = each row of scores over its sum, and
// lse[N] = logsumexp of each row of logits.
void router_sigmoid(float* scores, float* probs, float* lse, const float* logits, int64_t N, int E);

// ASSIGNS expert[N, k] (the k experts of highest score + bias[e] (bias null: the score),
// descending, ties to the lower index) and gate[N, k] (their scores, renormalised to sum to 1
// when `renormalize`).
void router_top_k(int32_t* expert, float* gate, const float* scores, int64_t N, int E, int k,
                  const float* bias = nullptr, bool renormalize = true);

// Assignments an expert takes per sequence of T tokens; 0 = unlimited (capacity_factor 0).
int64_t expert_capacity(const MoeConfig& m, int T);

// ASSIGNS kept[B T, k] = 1 where assignment (t, j) fits in its expert's per-sequence capacity
// (filled in the order (j, t)), else 0; capacity 0 keeps everything. Returns the dropped count.
int64_t router_capacity(uint8_t* kept, const int32_t* expert, int B, int T, int E, int k,
                        int64_t capacity);

// The auxiliary losses' sums over this micro-batch: sum_s balance_s and sum_t lse_t^2.
struct RouterLossSums {
  double balance = 0;
  double z = 0;
};
RouterLossSums router_loss_sums(const float* probs, const float* lse, const int32_t* expert, int B,
                                int T, int E, int k, const double* counts = nullptr,
                                int seq_len = 0);

// ASSIGNS dlogits[N, E]: the gradient of the objective with respect to the router logits of a
// softmax router, from
//   dgate[N, k]   dL/d gate (the experts' outputs dotted with the output gradient; 0 if dropped)
//   balance_weight = aux_loss x loss_scale, z_weight = z_loss x loss_scale.
void router_backward(float* dlogits, const float* dgate, const float* probs, const float* lse,
                     const int32_t* expert, const float* gate, int B, int T, int E, int k,
                     float balance_weight, float z_weight, bool renormalize = true,
                     const double* counts = nullptr, int seq_len = 0);

// The same for a sigmoid router (scores, probs and lse of router_sigmoid; the z-loss's softmax
// from logits and lse).
void router_backward_sigmoid(float* dlogits, const float* dgate, const float* scores,
                             const float* probs, const float* lse, const float* logits,
                             const int32_t* expert, const float* gate, int B, int T, int E, int k,
                             float balance_weight, float z_weight, bool renormalize,
                             const double* counts = nullptr, int seq_len = 0);

}  // namespace tessera::nn
