// The input layer as a module. GPT-2's: token embedding (wte) + learned positions (wpe), then the
// "drop" dropout. The Llama family's: the token embedding alone ("model.embed_tokens.weight"; the
// positions are rotary, in the attention; no dropout: cfg.dropout acts on attention probabilities).
// forward/backward run over an activation record that the caller owns, so any number of
// micro-batches can be in flight. Parameter gradients ACCUMULATE.
//
// Vocabulary parallelism (built with a TensorSplit of t > 1 ranks): wte is split by rows
// (vocab_range in tensor_parallel.h: unequal shards when t does not divide V, no padding rows).
// A rank looks up the tokens in its rows and writes zeros for the others; one all-reduce over the
// group completes the lookup (exact: every element is one value plus zeros), then the positions
// and the dropout are applied as on one device. The backward accumulates only the local rows.
//
// Sequence parallelism: the output holds this rank's rows of the B*T tokens (token_range). The
// partial lookups are reduce-scattered instead of all-reduced (reduce_scatter_from_tp), and the
// positions and the dropout apply to the rank's rows; the backward all-gathers the gradient of the
// rows, so the wte rows and wpe get their gradients from every token (complete on every rank).
//
// Context parallelism (Batch::positions): the rows are this rank's share of each sequence; wpe is
// read (and its gradient written) at their global positions, and the dropout mask keyed by their
// global tokens (kernels/row_map.h), so a cp rank computes what one rank computes for them.

#pragma once

#include <cstdint>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/tensor.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/parameters.h"
#include "tessera/nn/tensor_parallel.h"

namespace tessera::nn {

class Embedding {
 public:
  struct Record {
    Tensor tokens;  // I32 [B, T], a copy of the micro-batch's tokens
    Tensor mask;    // U8 [rows, C] dropout mask of this rank's rows (only with dropout)
    int B = 0, T = 0;
    float p = 0.0f;  // dropout probability in effect for this micro-batch
    // The rows' global positions under context parallelism (empty: 0..T-1).
    std::vector<int64_t> positions;
  };

  // Registers wte ([V, C], this rank's rows under `split`) and wpe ([block_size, C]). Records hold
  // rows_per_sequence rows of each sequence (0: block_size; a context-parallel rank's share:
  // ContextSplit::rows_per_sequence).
  Embedding(ParameterSet& ps, const GPTConfig& cfg, TensorSplit split,
            int64_t rows_per_sequence = 0);
  Record make_record(int max_batch, Allocator& alloc) const;
  int wte() const { return wte_; }
  int wpe() const { return wpe_; }  // -1: none (the Llama family)

  // ASSIGNS out[rows, C] = dropout(wte[tokens] + wpe[t]) for this rank's rows (all B*T without
  // sequence parallelism). scratch: token_range(B*T).padded() x C floats, needed only under
  // sequence parallelism.
  void forward(const StepContext& ctx, const Batch& b, float* out, Record& r,
               float* scratch = nullptr) const;
  // Generation with a key/value cache (GPT::decode; no tensor parallelism): ASSIGNS out[n, C] =
  // wte[tokens[i]] + wpe[pos0 + i] (GPT-2; the Llama family: wte alone), no dropout. Ids and
  // positions checked by the caller.
  void decode(const int32_t* tokens, int n, int64_t pos0, float* out) const;
  // Given dout[rows, C] (overwritten: the dropout backward runs in place), ACCUMULATES the wte
  // and wpe gradients. scratch as for forward.
  void backward(Record& r, float* dout, float* scratch = nullptr) const;

 private:
  const ParameterSet& ps_;
  GPTConfig cfg_;
  TensorSplit split_;
  VocabRange rows_;
  int64_t rows_per_sequence_;
  int wte_ = -1, wpe_ = -1;
  uint64_t site_;
};

}  // namespace tessera::nn
