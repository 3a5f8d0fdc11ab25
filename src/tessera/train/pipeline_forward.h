// The forward of a whole model whose stages may be spread over pipeline ranks, one batch at a time
// and without gradients: evaluation and sampling between training steps. Stage s (chunk s / pp of
// pipeline rank s % pp) runs when its input arrives and passes its output on; the last stage's
// loss or logits are then shared with every pipeline rank. Collective over the pipeline group
// (and, inside each stage, over its tensor-parallel group). Uses each chunk's shared record.
#pragma once

#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/nn/gpt.h"

namespace tessera::train {

class PipelineForward {
 public:
  // chunks[c]: model stage c * pp + rank of this rank; pp: the pipeline group (one rank: a single
  // stage, chunks = {the whole model}); wire: what hidden states travel in between stages (F32 or
  // BF16, as in training: comm/wire.h).
  PipelineForward(std::vector<nn::GPT*> chunks, comm::Communicator& pp, DType wire = DType::F32);

  const nn::GPTConfig& config() const { return chunks_.front()->config(); }
  // The model, when it is whole on this rank (no pipeline group), else null.
  nn::GPT* whole_model() const { return pp_size_ == 1 ? chunks_.front() : nullptr; }
  // The sum of b's token losses, on every pipeline rank.
  double loss_sum(const nn::Batch& b, const nn::StepContext& ctx);
  // The full [V] logits of row `row` (b * T + t) of b, on every pipeline rank.
  std::vector<float> logits_row(const nn::Batch& b, const nn::StepContext& ctx, int64_t row);

 private:
  // Runs every stage this rank holds; returns the last stage's model if this rank holds it.
  nn::GPT* run(const nn::Batch& b, const nn::StepContext& ctx, double& loss);
  int last_rank() const { return pp_size_ - 1; }

  std::vector<nn::GPT*> chunks_;
  comm::Communicator& pp_;
  int pp_size_, rank_;
  DType wire_;
};

}  // namespace tessera::train
