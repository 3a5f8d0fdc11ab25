// Fused softmax + cross-entropy over the vocabulary. Rows whose target is -1 are ignored
// (loss 0, gradient 0).
#pragma once

#include <cstdint>

namespace tessera::kernels {

// ASSIGNS losses[N] = logsumexp(logits[n]) - logits[n, targets[n]] (0 where the target is -1)
// and saves lse[N] = logsumexp(logits[n]) (for the backward). logits[N,V]; targets[N] in
// [-1, V) (validated by the caller). Returns the sum of the losses in double.
double softmax_xent_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                            int N, int V);

// ASSIGNS dlogits[N,V] = (softmax(logits[n]) - onehot(targets[n])) * scale, zero rows where the
// target is -1. `scale` is the loss normaliser (1 / global target-token count). dlogits may
// alias logits (in place). Uses the saved lse[N].
void softmax_xent_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* targets, float scale, int N, int V);

}  // namespace tessera::kernels

// ---- The same loss over a vocabulary split across ranks (vocabulary-parallel head) -----------
// A rank holds logits[N, V] for the vocabulary slice [vocab_begin, vocab_begin + V). The caller
// combines the per-row statistics across the slices (max of row_max, sum of sum_exp and
// target_logit) and never needs the full logits.
namespace tessera::kernels {

// ASSIGNS row_max[N] = max over the slice of logits[n].
void vocab_slice_max(float* row_max, const float* logits, int N, int V);

// Given the global row maxima, ASSIGNS sum_exp[N] = sum over the slice of exp(logits[n] - max[n])
// and target_logit[N] = logits[n, targets[n] - vocab_begin] when the target lies in the slice,
// else 0 (also for target -1).
void vocab_slice_sum_exp(float* sum_exp, float* target_logit, const float* logits,
                         const float* row_max, const int32_t* targets, int64_t vocab_begin, int N,
                         int V);

// ASSIGNS dlogits[N, V] = (softmax(logits[n]) - onehot(targets[n])) * scale over the slice, with
// the global lse[N]; the one-hot term only where the target lies in the slice; zero rows where the
// target is -1. dlogits may alias logits.
void softmax_xent_backward_slice(float* dlogits, const float* logits, const float* lse,
                                 const int32_t* targets, int64_t vocab_begin, float scale, int N,
                                 int V);

}  // namespace tessera::kernels
