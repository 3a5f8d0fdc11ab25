// Context parallelism (docs/ARCHITECTURE.md decision 42): the sequence of every micro-batch split
// over the n ranks of a context-parallel group. This header holds the group a model is built with
// (ContextSplit) and the token map every token-wise site follows: which rows of each sequence a
// rank holds and at which global positions.
//
// Causal load balancing (Megatron-LM's and torchtitan's head-tail order): a sequence of T tokens is
// cut into 2n chunks of T / (2n), and cp rank r holds chunks r and 2n - 1 - r, in that order, so
// every rank has as many early (cheap) as late (expensive) queries of the causal attention. A
// rank's rows of a sequence are therefore T / n rows whose global positions are
//   r c, r c + 1, ..., (r + 1) c - 1,   (2n - 1 - r) c, ..., (2n - r) c - 1,    c = T / (2n).
// The tokens and targets are sliced by these positions (slice_sequences), learned positions and
// rotary angles are taken at them, and every dropout site keys its mask by the global token
// (sample * T + position: kernels/row_map.h), so a cp rank computes exactly the numbers one rank
// computes for its tokens. The attention is the one place where the ranks of a sequence meet
// (nn/context_parallel_attention.h), and a mixture of experts' per-sequence capacity and balance
// loss (nn/moe.h) the other.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/kernels/row_map.h"
#include "tessera/nn/gpt_config.h"

namespace tessera::nn {

// The context-parallel group a model's sequences are split over, and how its attention exchanges
// keys and values (CpComm, gpt_config.h). Always a group: one rank (comm::one_rank()) means whole
// sequences, and nothing is exchanged.
struct ContextSplit {
  explicit ContextSplit(comm::Communicator& g, CpComm c = CpComm::AllGather) : group(g), comm(c) {}
  comm::Communicator& group;
  CpComm comm = CpComm::AllGather;
  int size() const { return group.size(); }
  int rank() const { return group.rank(); }
  // The rows of each sequence of up to block_size tokens this rank holds, what its activations
  // are sized for: ceil(block_size / n) (block_size on one rank).
  int64_t rows_per_sequence(int64_t block_size) const { return (block_size + size() - 1) / size(); }
};

// The global positions of the T / n rows cp rank r of n holds of a sequence of T tokens (see
// above); n = 1: 0..T-1. ShapeError unless 2n divides T (n > 1).
std::vector<int64_t> context_positions(int64_t T, int n, int r);

// ASSIGNS out[B, T_local] = in[b, positions[t]] for each of B sequences of in[B, T] (token ids or
// targets: a cp rank's share of a micro-batch).
void slice_sequences(int32_t* out, const int32_t* in, int B, int64_t T, const int64_t* positions,
                     int64_t T_local);

// Where the rows of a micro-batch lie in the step's global batch (kernels/row_map.h): B sequences
// from first_sample on, T rows each here, of seq_len tokens (0: T) at `positions` (null: 0..T-1).
kernels::RowMap row_map(const Batch& b);

}  // namespace tessera::nn
