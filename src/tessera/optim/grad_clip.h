// Global-norm gradient clipping. The norm is over all gradients of the model; in a sharded layout
// the caller sums the squared partial norms across ranks before clipping (sum_of_squares(), then
// clip_scale() of the global norm), so clipping is exact across shards. The engines hand that
// scale to the optimizer (Optimizer::scale_gradients_in_next_step); clip_to_norm() scales the
// gradients in place instead.
#pragma once

#include "tessera/nn/parameters.h"
#include "tessera/optim/optimizer.h"

namespace tessera::optim {

// Over a rank's optimizer segments (whole parameters or its ZeRO shard): the sum of squares of
// the gradients of the parameters whose copy counts in the global norm
// (ParamInfo::reduction.counts_in_norm), accumulated in double. The caller sums it over the ranks
// whose segments are disjoint pieces of the model; every global element is then counted once.
double grad_sum_of_squares(const std::vector<Segment>& segments, const nn::ParameterSet& params);
// The factor clipping to max_norm applies to gradients of global norm `norm`: max_norm / (norm +
// 1e-6) when norm > max_norm (and max_norm > 0), else 1. Every clipping below (and a device's)
// scales by it.
float clip_scale(double norm, double max_norm);
// Scales every segment's gradient by max_norm / (norm + 1e-6) when norm > max_norm. Returns the
// scale applied (1 if none).
float clip_to_norm(const std::vector<Segment>& segments, double norm, double max_norm);

// Sum of squares of the gradients, accumulated in double.
double grad_sum_of_squares(const nn::ParameterSet& params);
// Scales gradients by max_norm / norm when norm > max_norm. Returns the scale applied (1 if none).
float clip_to_norm(nn::ParameterSet& params, double norm, double max_norm);
// Single-rank convenience: computes the norm, clips, returns the norm before clipping.
double clip_grad_norm(nn::ParameterSet& params, double max_norm);

}  // namespace tessera::optim
