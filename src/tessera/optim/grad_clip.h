// Global-norm gradient clipping. The norm is over all gradients of the model; in a sharded layout
// the caller sums the squared partial norms across ranks before clipping (sum_of_squares() then
// clip_to_norm() with the global norm), so clipping is exact across shards.
#pragma once

#include "tessera/nn/parameters.h"

namespace tessera::optim {

// Sum of squares of the gradients, accumulated in double.
double grad_sum_of_squares(const nn::ParameterSet& params);
// Scales gradients by max_norm / norm when norm > max_norm. Returns the scale applied (1 if none).
float clip_to_norm(nn::ParameterSet& params, double norm, double max_norm);
// Single-rank convenience: computes the norm, clips, returns the norm before clipping.
double clip_grad_norm(nn::ParameterSet& params, double max_norm);

}  // namespace tessera::optim
