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
