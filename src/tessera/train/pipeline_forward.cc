#include "tessera/train/pipeline_forward.h"

#include "tessera/comm/wire.h"
#include "tessera/core/error.h"
#include "tessera/parallel/gather.h"

namespace tessera::train {

PipelineForward::PipelineForward(std::vector<nn::GPT*> chunks, comm::Communicator& pp, DType wire)
    : chunks_(std::move(chunks)), pp_(pp), pp_size_(pp.size()), rank_(pp.rank()), wire_(wire) {
  comm::check_wire_dtype(wire);
  TESSERA_ASSERT(!chunks_.empty(), "a pipeline forward needs at least one model chunk");
  TESSERA_ASSERT(pp_size_ > 1 || (chunks_.size() == 1 && chunks_.front()->has_embedding() &&
                                  chunks_.front()->has_head()),
                 "without a pipeline group the chunk must be the whole model");
}

nn::GPT* PipelineForward::run(const nn::Batch& b, const nn::StepContext& ctx, double& loss) {
  const int stages = pp_size_ * static_cast<int>(chunks_.size());
  nn::GPT* last = nullptr;
  for (int s = 0; s < stages; ++s) {
    if (s % pp_size_ != rank_) continue;
    nn::GPT& model = *chunks_[static_cast<size_t>(s / pp_size_)];
    // This rank's rows of the hidden state (all of it without sequence parallelism).
    const int64_t n = model.hidden_elems(b.B, b.T);
    const size_t count = static_cast<size_t>(n);
    const bool bf16 = wire_ == DType::BF16;
    nn::StageRecord& rec = model.shared_record();
    comm::RecvOptions ro;
    ro.tag = 2 * s;
    if (s > 0 && !bf16) {
      pp_.recv(model.input(rec), count, DType::F32, (s - 1) % pp_size_, ro).wait();
    } else if (s > 0) {
      Tensor w = comm::wire_buffer(n, "pipeline.recv_bf16");
      pp_.recv(w.raw(), count, DType::BF16, (s - 1) % pp_size_, ro).wait();
      comm::from_wire(model.input(rec), w, 0, n);
    }
    loss = model.forward(ctx, b, rec);
    comm::SendOptions so;
    so.tag = 2 * (s + 1);
    if (s + 1 == stages) {
      last = &model;
    } else if (!bf16) {
      pp_.send(model.output(rec), count, DType::F32, (s + 1) % pp_size_, so).wait();
    } else {
      const Tensor w = comm::to_wire(model.output(rec), n, "pipeline.send_bf16");
      pp_.send(w.raw(), count, DType::BF16, (s + 1) % pp_size_, so).wait();
    }
  }
  return last;
}

double PipelineForward::loss_sum(const nn::Batch& b, const nn::StepContext& ctx) {
  double loss = 0;
  nn::GPT* last = run(b, ctx, loss);
  return parallel::all_reduce_sum(pp_, last ? loss : 0.0);
}

std::vector<float> PipelineForward::logits_row(const nn::Batch& b, const nn::StepContext& ctx,
                                               int64_t row) {
  double loss = 0;
  nn::GPT* last = run(b, ctx, loss);
  std::vector<float> logits(static_cast<size_t>(config().vocab_size));
  if (last) logits = last->full_logits_row(row);  // collective over the stage's tp group
  comm::BroadcastOptions o;
  o.root = last_rank();
  pp_.broadcast(logits.data(), logits.size(), DType::F32, o).wait();
  return logits;
}

}  // namespace tessera::train
