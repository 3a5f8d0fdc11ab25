#include "tessera/parallel/pipeline/step_executor.h"

#include <chrono>
#include <cstring>

#include "tessera/comm/wire.h"
#include "tessera/core/error.h"
#include "tessera/core/trace.h"

namespace tessera::parallel {

namespace {
std::string label(const char* what, int micro_batch) {  // "F3" (avoids GCC 12's -Wrestrict)
  std::string s(what);
  s += std::to_string(micro_batch);
  return s;
}

void wait_all(std::vector<comm::Work>& works) {
  for (comm::Work& w : works) w.wait();  // rethrows a failed send
  works.clear();
}
}  // namespace

StepExecutor::StepExecutor(std::vector<nn::StageModel*> chunks, comm::Communicator& pp, DType wire)
    : pp_(pp), wire_(wire) {
  comm::check_wire_dtype(wire);
  TESSERA_ASSERT(!chunks.empty(), "a step executor needs at least one model chunk");
  for (nn::StageModel* m : chunks) {
    TESSERA_ASSERT(m != nullptr, "a step executor's model chunk is missing");
    Chunk c;
    c.model = m;
    chunks_.push_back(std::move(c));
  }
}

nn::StageRecord& StepExecutor::acquire(Chunk& c, int m, int pending) {
  if (static_cast<int>(c.slot_of.size()) <= m) {
    c.slot_of.resize(m + 1, -1);
    c.dout_of.resize(m + 1, -1);
    c.pending_of.resize(m + 1, 0);
  }
  TESSERA_ASSERT(c.slot_of[m] < 0, "micro-batch ", m, " is already in flight");
  if (c.free.empty()) {
    Slot s;
    if (c.pool.empty()) {
      s.record = &c.model->shared_record();
    } else {
      c.owned.push_back(c.model->make_record());
      s.record = c.owned.back().get();
    }
    c.pool.push_back(std::move(s));
    c.free.push_back(static_cast<int>(c.pool.size()) - 1);
  }
  c.slot_of[m] = c.free.back();
  c.free.pop_back();
  c.pending_of[m] = pending;
  Slot& slot = c.pool[static_cast<size_t>(c.slot_of[m])];
  wait_all(slot.sends);  // its last micro-batch's activation and gradient have left
  return *slot.record;
}

StepExecutor::Slot& StepExecutor::in_flight(Chunk& c, int m) {
  TESSERA_ASSERT(m < static_cast<int>(c.slot_of.size()) && c.slot_of[m] >= 0, "micro-batch ", m,
                 " has no forward in flight");
  return c.pool[static_cast<size_t>(c.slot_of[m])];
}

void StepExecutor::done(Chunk& c, int m) {
  if (--c.pending_of[m] > 0) return;
  c.free.push_back(c.slot_of[m]);
  c.slot_of[m] = -1;
}

Tensor& StepExecutor::output_grad_buffer(int& index, int64_t elems) {
  if (free_douts_.empty()) {
    douts_.push_back(
        Tensor::zeros({elems}, DType::F32, MemCategory::Activations, "pipeline.output_grad"));
    free_douts_.push_back(static_cast<int>(douts_.size()) - 1);
  }
  index = free_douts_.back();
  free_douts_.pop_back();
  return douts_[static_cast<size_t>(index)];
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
  sends_.push_back(SendBuffer{
      Tensor::zeros({elems}, wire_, MemCategory::Activations, "pipeline.send_bf16"), comm::Work()});
  return sends_.back();
}

void StepExecutor::post_send(Slot& from, const float* src, int64_t n, int peer, int tag) {
  comm::SendOptions o;
  o.tag = tag;
  if (wire_ == DType::F32) {  // straight from the record, which waits for it before reuse
    from.sends.push_back(pp_.send(src, static_cast<size_t>(n), DType::F32, peer, o));
    return;
  }
  SendBuffer& buf = send_buffer(n);
  comm::to_wire(buf.data, 0, src, n);
  buf.work = pp_.send(buf.data.raw(), static_cast<size_t>(n), wire_, peer, o);
}

void StepExecutor::receive(float* dst, int64_t n, int peer, int tag) {
  comm::RecvOptions o;
  o.tag = tag;
  if (wire_ == DType::F32) {
    pp_.recv(dst, static_cast<size_t>(n), DType::F32, peer, o).wait();
    return;
  }
  if (!recv_wire_.defined())
    recv_wire_ = Tensor::empty({n}, DType::BF16, MemCategory::Activations, "pipeline.recv_bf16");
  TESSERA_ASSERT(recv_wire_.numel() == n, "receive buffer of ", recv_wire_.numel(),
                 " elements for ", n);
  pp_.recv(recv_wire_.raw(), static_cast<size_t>(n), DType::BF16, peer, o).wait();
  comm::from_wire(dst, recv_wire_, 0, n);
}

void StepExecutor::finish_sends() {
  for (SendBuffer& b : sends_) {
    b.work.wait();
    b.work = comm::Work();
  }
  for (Chunk& c : chunks_)
    for (Slot& s : c.pool) wait_all(s.sends);
}

// The output gradient received for micro-batch m (its buffer freed for the next receive), or
// null on the last stage, which starts from its loss.
const float* StepExecutor::output_grad_of(Chunk& c, int m) {
  const int d = c.dout_of.size() > static_cast<size_t>(m) ? c.dout_of[m] : -1;
  if (d < 0) return nullptr;
  free_douts_.push_back(d);
  c.dout_of[m] = -1;
  return douts_[static_cast<size_t>(d)].f32();  // valid until the next receive into it
}

void StepExecutor::execute(const Schedule& s, int rank, const Action& a, const nn::StepContext& ctx,
                           const StepCallbacks& cb, int64_t boundary_elems, double& loss_sum) {
  Chunk& c = chunks_[static_cast<size_t>(a.chunk)];
  nn::StageModel& model = *c.model;
  const int m = a.micro_batch;
  const int stage = s.stage_of(rank, a.chunk);
  const int pp = s.pp;
  const int prev = (rank + pp - 1) % pp, next = (rank + 1) % pp;
  // The gradient reductions happen in the step's last micro-batch (ZeRO-2/3: in every one).
  const nn::BackwardPass pass{m == s.micro_batches - 1};
  switch (a.kind) {
    case ActionKind::RecvForward: {
      TraceSpan span(label("recv F", m), "comm", 2);
      // Held until its backward has ended and its input gradient has been posted.
      receive(model.input(acquire(c, m, 2)), boundary_elems, prev, tag(stage, false));
      break;
    }
    case ActionKind::Forward: {
      nn::StageRecord& rec = stage == 0 ? acquire(c, m, 1) : *in_flight(c, m).record;
      const nn::Batch b = cb.fetch(m);
      TraceSpan span(label("F", m), "forward", 2);
      loss_sum += model.forward(ctx, b, rec);
      break;
    }
    case ActionKind::SendForward: {
      Slot& slot = in_flight(c, m);
      post_send(slot, model.output(*slot.record), boundary_elems, next, tag(stage + 1, false));
      break;
    }
    case ActionKind::RecvBackward: {
      TraceSpan span(label("recv B", m), "comm", 2);
      int index = -1;
      Tensor& dout = output_grad_buffer(index, boundary_elems);
      c.dout_of[m] = index;
      receive(dout.f32(), boundary_elems, next, tag(stage, true));
      break;
    }
    case ActionKind::Backward: {
      nn::StageRecord& rec = *in_flight(c, m).record;
      const float* dout = output_grad_of(c, m);
      {
        TraceSpan span(label("B", m), "backward", 2);
        model.backward(rec, dout, pass);
      }
      done(c, m);
      break;
    }
    case ActionKind::BackwardInput: {
      nn::StageRecord& rec = *in_flight(c, m).record;
      const float* dout = output_grad_of(c, m);
      TraceSpan span(label("BI", m), "backward-input", 2);
      model.backward_input(rec, dout);
      break;  // the record stays for W
    }
    case ActionKind::BackwardWeight: {
      {
        TraceSpan span(label("W", m), "backward-weight", 2);
        model.backward_weight(*in_flight(c, m).record, pass);
      }
      done(c, m);
      break;
    }
    case ActionKind::SendBackward: {  // from the record
      Slot& slot = in_flight(c, m);
      post_send(slot, model.input_grad(*slot.record), boundary_elems, prev, tag(stage - 1, true));
      done(c, m);
      break;
    }
    case ActionKind::ReduceGradients:
      cb.reduce_gradients();
      break;
    default:
      TESSERA_ASSERT(false, "action ", to_string(a), " is not run by this executor");
  }
}

double StepExecutor::run(const Schedule& schedule, const nn::StepContext& ctx,
                         const StepCallbacks& callbacks, int64_t boundary_elems) {
  const int rank = pp_.rank();
  TESSERA_ASSERT(schedule.pp == pp_.size(), "a schedule of ", schedule.pp,
                 " pipeline ranks on a pipeline group of ", pp_.size());
  TESSERA_ASSERT(schedule.virtual_stages == static_cast<int>(chunks_.size()), "the schedule has ",
                 schedule.virtual_stages, " chunks per rank, the executor ", chunks_.size());
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  timing_ = StepTiming{};
  double loss_sum = 0;
  for (const Action& a : schedule.ranks[static_cast<size_t>(rank)]) {
    if (a.kind == ActionKind::OptimizerStep) {
      finish_sends();
      callbacks.optimizer_step(loss_sum);
      continue;
    }
    const Clock::time_point t0 = Clock::now();
    execute(schedule, rank, a, ctx, callbacks, boundary_elems, loss_sum);
    if (is_compute(a.kind)) {
      const Clock::time_point t1 = Clock::now();
      timing_.compute_seconds += std::chrono::duration<double>(t1 - t0).count();
      timing_.pipeline_seconds = std::chrono::duration<double>(t1 - start).count();
    }
  }
  return loss_sum;
}

}  // namespace tessera::parallel
