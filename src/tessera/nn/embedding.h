// GPT-2's input layer as a module: token embedding (wte) + learned positions (wpe), then the
// "drop" dropout. forward/backward run over an activation record that the caller owns, so any
// number of micro-batches can be in flight. Parameter gradients ACCUMULATE.

#pragma once

#include <cstdint>

#include "tessera/core/allocator.h"
#include "tessera/core/tensor.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/parameters.h"

namespace tessera::nn {

class Embedding {
 public:
  struct Record {
    Tensor tokens;  // I32 [B, T], a copy of the micro-batch's tokens
    Tensor mask;    // U8 [B, T, C] dropout mask (only with dropout)
    int B = 0, T = 0;
    float p = 0.0f;  // dropout probability in effect for this micro-batch
  };

  // Registers wte ([V, C]) and wpe ([block_size, C]).
  Embedding(ParameterSet& ps, const GPTConfig& cfg);
  Record make_record(int max_batch, Allocator& alloc) const;
  int wte() const { return wte_; }
  int wpe() const { return wpe_; }

  // ASSIGNS out[B, T, C] = dropout(wte[tokens] + wpe[t]).
  void forward(const StepContext& ctx, const Batch& b, float* out, Record& r) const;
  // Given dout[B, T, C] (overwritten: the dropout backward runs in place), ACCUMULATES the wte
  // and wpe gradients.
  void backward(Record& r, float* dout) const;

 private:
  const ParameterSet& ps_;
  GPTConfig cfg_;
  int wte_ = -1, wpe_ = -1;
  uint64_t site_;
};

}  // namespace tessera::nn
