#include "tessera/train/step_executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/trace.h"
#include "tessera/nn/wire.h"

namespace tessera::train {

using parallel::ActionKind;

namespace {
std::string label(const char* what, int micro_batch) {  // "F3" (avoids GCC 12's -Wrestrict)
  std::string s(what);
  s += std::to_string(micro_batch);
  return s;
}
}  // namespace

StepExecutor::StepExecutor(std::vector<StageChunk> chunks, PipelineLinks links) : links_(links) {
  TESSERA_ASSERT(!chunks.empty(), "a step executor needs at least one model chunk");
  for (const StageChunk& s : chunks) {
    Chunk c;
    c.stage = s;
    chunks_.push_back(std::move(c));
  }
}

nn::GPT::Record& StepExecutor::acquire(Chunk& c, int m) {
  if (static_cast<int>(c.slot_of.size()) <= m) {
    c.slot_of.resize(m + 1, -1);
    c.sends_of.resize(m + 1);
    c.dout_of.resize(m + 1, -1);
  }
  TESSERA_ASSERT(c.slot_of[m] < 0, "micro-batch ", m, " is already in flight");
  if (c.free.empty()) {
    if (c.pool.empty()) {
      c.pool.push_back(&c.stage.model->single_record());
    } else {
      c.owned.push_back(c.stage.model->make_record());
      c.pool.push_back(c.owned.back().get());
    }
    c.free.push_back(static_cast<int>(c.pool.size()) - 1);
  }
  c.slot_of[m] = c.free.back();
  c.free.pop_back();
  return *c.pool[c.slot_of[m]];
}

nn::GPT::Record& StepExecutor::in_flight(Chunk& c, int m) {
  TESSERA_ASSERT(m < static_cast<int>(c.slot_of.size()) && c.slot_of[m] >= 0, "micro-batch ", m,
                 " has no forward in flight");
  return *c.pool[c.slot_of[m]];
}

void StepExecutor::release(Chunk& c, int m) {
  c.sends_of[m].wait();  // the activation left the record (done long ago: its gradient came back)
  c.sends_of[m] = comm::Work();
  c.free.push_back(c.slot_of[m]);
  c.slot_of[m] = -1;
}

void StepExecutor::begin_micro_batch(Chunk& c, bool last) {
  c.stage.engine->begin_micro_batch(last);
  if (c.stage.experts) c.stage.experts->begin_micro_batch(last);
}

Tensor& StepExecutor::buffer(std::vector<Tensor>& pool, std::vector<int>& free, int& index,
                             int64_t elems) {
  if (free.empty()) {
    pool.push_back(
        Tensor::zeros({elems}, DType::F32, MemCategory::Activations, "pipeline.output_grad"));
    free.push_back(static_cast<int>(pool.size()) - 1);
  }
  index = free.back();
  free.pop_back();
  return pool[static_cast<size_t>(index)];
}

StepExecutor::SendBuffer& StepExecutor::send_buffer(int64_t elems) {
  for (SendBuffer& b : sends_)
    if (b.work.is_completed()) {
      b.work.wait();  // rethrows a failed send
      b.work = comm::Work();
      TESSERA_ASSERT(b.data.numel() == elems, "send buffer of ", b.data.numel(), " elements for ",
                     elems);
      return b;
    }
  const bool bf16 = links_.wire == DType::BF16;
  sends_.push_back(
      SendBuffer{Tensor::zeros({elems}, links_.wire, MemCategory::Activations,
                               bf16 ? "pipeline.send_bf16" : "pipeline.input_grad_send"),
                 comm::Work()});
  return sends_.back();
}

comm::Work StepExecutor::post_send(const float* src, int64_t n, int peer, int tag, bool copy_fp32) {
  nn::check_wire_dtype(links_.wire);
  comm::SendOptions o;
  o.tag = tag;
  sent_bytes_ += static_cast<double>(n) * static_cast<double>(dtype_size(links_.wire));
  if (links_.wire == DType::F32 && !copy_fp32)
    return links_.pp->send(src, static_cast<size_t>(n), DType::F32, peer, o);
  SendBuffer& buf = send_buffer(n);
  if (links_.wire == DType::BF16)
    nn::to_wire(buf.data, 0, src, n);
  else
    std::memcpy(buf.data.f32(), src, static_cast<size_t>(n) * sizeof(float));
  buf.work = links_.pp->send(buf.data.raw(), static_cast<size_t>(n), links_.wire, peer, o);
  return buf.work;
}

void StepExecutor::receive(float* dst, int64_t n, int peer, int tag) {
  comm::RecvOptions o;
  o.tag = tag;
  if (links_.wire == DType::F32) {
    links_.pp->recv(dst, static_cast<size_t>(n), DType::F32, peer, o).wait();
    return;
  }
  if (!recv_wire_.defined())
    recv_wire_ = Tensor::empty({n}, DType::BF16, MemCategory::Activations, "pipeline.recv_bf16");
  TESSERA_ASSERT(recv_wire_.numel() == n, "receive buffer of ", recv_wire_.numel(),
                 " elements for ", n);
  links_.pp->recv(recv_wire_.raw(), static_cast<size_t>(n), DType::BF16, peer, o).wait();
  nn::from_wire(dst, recv_wire_, 0, n);
}

void StepExecutor::finish_sends() {
  for (SendBuffer& b : sends_) {
    b.work.wait();
    b.work = comm::Work();
  }
}

void StepExecutor::reduce_gradients() {
  for (Chunk& c : chunks_) {
    c.stage.engine->end_backward();
    if (c.stage.experts) c.stage.experts->end_backward();
  }
  if (links_.embedding_group != nullptr)
    for (Chunk& c : chunks_) c.stage.engine->sum_embedding_group(*links_.embedding_group);
}

void StepExecutor::execute(const parallel::Schedule& s, int rank, const parallel::Action& a,
                           const nn::StepContext& ctx, const std::function<nn::Batch(int)>& fetch,
                           int64_t boundary_elems, double& loss_sum) {
  Chunk& c = chunks_[static_cast<size_t>(a.chunk)];
  nn::GPT& model = *c.stage.model;
  const int m = a.micro_batch;
  const int stage = s.stage_of(rank, a.chunk);
  const int pp = s.stages;
  const int prev = (rank + pp - 1) % pp, next = (rank + 1) % pp;
  switch (a.kind) {
    case ActionKind::RecvForward: {
      TraceSpan span(label("recv F", m), "comm", 2);
      receive(model.input(acquire(c, m)), boundary_elems, prev, tag(stage, false));
      break;
    }
    case ActionKind::Forward: {
      nn::GPT::Record& rec = model.has_embedding() ? acquire(c, m) : in_flight(c, m);
      const nn::Batch b = fetch(m);
      TraceSpan span(label("F", m), "forward", 2);
      loss_sum += model.forward(ctx, b, rec);
      break;
    }
    case ActionKind::SendForward:  // fp32: straight from the record, alive until release
      c.sends_of[m] = post_send(model.output(in_flight(c, m)), boundary_elems, next,
                                tag(stage + 1, false), false);
      break;
    case ActionKind::RecvBackward: {
      TraceSpan span(label("recv B", m), "comm", 2);
      int index = -1;
      Tensor& dout = buffer(douts_, free_douts_, index, boundary_elems);
      c.dout_of[m] = index;
      receive(dout.f32(), boundary_elems, next, tag(stage, true));
      break;
    }
    case ActionKind::Backward: {
      // The data-parallel engine reduces during the backward of the last micro-batch (ZeRO-2/3
      // in every one).
      begin_micro_batch(c, m == s.micro_batches - 1);
      const int d = c.dout_of.size() > static_cast<size_t>(m) ? c.dout_of[m] : -1;
      {
        TraceSpan span(label("B", m), "backward", 2);
        model.backward(in_flight(c, m), d >= 0 ? douts_[static_cast<size_t>(d)].f32() : nullptr);
      }
      if (d >= 0) free_douts_.push_back(d), c.dout_of[m] = -1;
      release(c, m);
      break;
    }
    case ActionKind::BackwardInput: {
      const int d = c.dout_of.size() > static_cast<size_t>(m) ? c.dout_of[m] : -1;
      {
        TraceSpan span(label("BI", m), "backward-input", 2);
        model.backward_input(in_flight(c, m),
                             d >= 0 ? douts_[static_cast<size_t>(d)].f32() : nullptr);
      }
      if (d >= 0) free_douts_.push_back(d), c.dout_of[m] = -1;
      break;  // the record stays for W
    }
    case ActionKind::BackwardWeight: {
      begin_micro_batch(c, m == s.micro_batches - 1);
      {
        TraceSpan span(label("W", m), "backward-weight", 2);
        model.backward_weight(in_flight(c, m));
      }
      release(c, m);
      break;
    }
    case ActionKind::SendBackward:  // copied: the next backward overwrites input_grad
      (void)post_send(model.input_grad(), boundary_elems, prev, tag(stage - 1, true), true);
      break;
    case ActionKind::ReduceGradients:
      reduce_gradients();
      break;
    default:
      TESSERA_ASSERT(false, "action ", parallel::to_string(a), " is not run by this executor");
  }
}

double StepExecutor::run(const parallel::Schedule& schedule, int rank, const nn::StepContext& ctx,
                         const std::function<nn::Batch(int)>& fetch,
                         const std::function<void(double)>& optimizer_step,
                         int64_t boundary_elems) {
  TESSERA_ASSERT(rank >= 0 && rank < static_cast<int>(schedule.ranks.size()), "rank ", rank,
                 " is not in the schedule");
  TESSERA_ASSERT(schedule.virtual_stages == static_cast<int>(chunks_.size()), "the schedule has ",
                 schedule.virtual_stages, " chunks per rank, the executor ", chunks_.size());
  TESSERA_ASSERT(schedule.stages == 1 || links_.pp != nullptr,
                 "a pipeline schedule needs the pipeline group");
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  timing_ = StepTiming{};
  sent_bytes_ = 0;
  double loss_sum = 0;
  for (const parallel::Action& a : schedule.ranks[static_cast<size_t>(rank)]) {
    if (a.kind == ActionKind::OptimizerStep) {
      finish_sends();
      optimizer_step(loss_sum);
      continue;
    }
    const Clock::time_point t0 = Clock::now();
    execute(schedule, rank, a, ctx, fetch, boundary_elems, loss_sum);
    if (parallel::is_compute(a.kind)) {
      const Clock::time_point t1 = Clock::now();
      timing_.compute_seconds += std::chrono::duration<double>(t1 - t0).count();
      timing_.pipeline_seconds = std::chrono::duration<double>(t1 - start).count();
    }
  }
  return loss_sum;
}

}  // namespace tessera::train
