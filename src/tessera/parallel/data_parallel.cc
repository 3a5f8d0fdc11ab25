#include "tessera/parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "tessera/core/error.h"
#include "tessera/io/tensor_set.h"
#include "tessera/optim/grad_clip.h"
#include "tessera/parallel/gather.h"

namespace tessera::parallel {

nn::FlatLayout flat_layout_for(const DataParallelOptions& o, int dp_size) {
  nn::FlatLayout f;
  const ZeroTraits z = traits(o.zero);
  f.unit_alignment = 16 * static_cast<int64_t>(z.sharded() ? dp_size : 1);
  f.full_params = !z.shards_parameters;
  f.full_grads = !z.shards_gradients;
  return f;
}

nn::GPTLayout gpt_layout_for(const DataParallelOptions& o, int dp_size, nn::GPTLayout base,
                             int expert_dp_size) {
  const nn::FlatLayout f = flat_layout_for(o, dp_size);
  base.expert_unit_alignment =
      flat_layout_for(o, expert_dp_size > 0 ? expert_dp_size : dp_size).unit_alignment;
  base.unit_alignment = f.unit_alignment;
  base.full_params = f.full_params;
  base.full_grads = f.full_grads;
  return base;
}

namespace {

// The UnitModel contract (nn/unit_model.h) as this engine needs it; a model written outside
// tessera gets a sentence that says what to change rather than an internal error later.
void check_model_layout(const nn::UnitModel& m, const nn::FlatLayout& want, ZeroStage stage) {
  const int zero = to_int(stage);
  const nn::ParameterSet& ps = m.params();
  TESSERA_CHECK_AS(ConfigError, ps.materialized(),
                   "DataParallel needs the model's parameters materialised: call "
                   "ParameterSet::materialize with parallel::flat_layout_for(options, dp size)");
  TESSERA_CHECK_AS(ConfigError, m.first_unit() <= m.last_unit(), "the model holds no unit (units ",
                   m.first_unit(), "..", m.last_unit(), ")");
  TESSERA_CHECK_AS(
      ConfigError,
      m.unit_begin(m.first_unit()) == 0 && m.unit_begin(m.last_unit() + 1) == ps.numel(),
      "the model's units must cover its flat parameters exactly: unit_begin(first) = ",
      m.unit_begin(m.first_unit()), ", unit_begin(last + 1) = ", m.unit_begin(m.last_unit() + 1),
      ", parameters ", ps.numel());
  for (int u = m.first_unit(); u <= m.last_unit(); ++u)
    TESSERA_CHECK_AS(
        ConfigError,
        m.unit_begin(u) <= m.unit_begin(u + 1) && m.unit_begin(u + 1) % want.unit_alignment == 0,
        "unit ", u, " ends at flat offset ", m.unit_begin(u + 1), ", which is not a multiple of ",
        want.unit_alignment, " (ZeRO ", zero,
        "): pad every unit with ParameterSet::pad_to_multiple("
        "flat_layout_for(options, dp size).unit_alignment)");
  TESSERA_CHECK_AS(ConfigError,
                   ps.flat_params().defined() == want.full_params &&
                       ps.flat_grads().defined() == want.full_grads,
                   "ZeRO ", zero, (want.full_params ? " keeps" : " shards"), " the parameters and ",
                   (want.full_grads ? "keeps" : "shards"),
                   " the gradients, but the model was materialised with full_params = ",
                   ps.flat_params().defined(), ", full_grads = ", ps.flat_grads().defined(),
                   ": materialise it with flat_layout_for(options, dp size)");
}

}  // namespace

DataParallel::DataParallel(nn::UnitModel& model, comm::Communicator& dp,
                           const DataParallelOptions& o, Allocator& alloc, HybridShards hybrid)
    : model_(model),
      ps_(model.params()),
      dp_(dp),
      shard_(hybrid.shard ? *hybrid.shard : dp),
      replicas_(hybrid.replicas),
      o_(o),
      alloc_(alloc) {
  TESSERA_CHECK_AS(ConfigError, (hybrid.shard == nullptr) == (hybrid.replicas == nullptr),
                   "hybrid sharding needs both the shard group and the replica group");
  if (replicas_) {
    TESSERA_CHECK_AS(ConfigError, traits(o.zero).sharded(),
                     "a ZeRO shard group smaller than the data-parallel group (HSDP) needs ",
                     config_key("zero"), " 1, 2 or 3; ZeRO 0 shards nothing");
    TESSERA_CHECK_AS(ConfigError, shard_.size() * replicas_->size() == dp.size(),
                     "the HSDP shard group (", shard_.size(), " ranks) times its replicas (",
                     replicas_->size(), ") must be the data-parallel group (", dp.size(), ")");
  }
  TESSERA_CHECK_AS(ConfigError, o.bucket_mb > 0, config_key("bucket_mb"), " must be positive");
  TESSERA_CHECK_AS(ConfigError,
                   o.grad_reduce_dtype == DType::F32 || o.grad_reduce_dtype == DType::BF16,
                   config_key("grad_reduce_dtype"), " must be fp32 or bf16");
  TESSERA_CHECK_AS(ConfigError,
                   o.param_gather_dtype == DType::F32 || o.param_gather_dtype == DType::BF16,
                   config_key("param_gather_dtype"), " must be fp32 or bf16");
  check_model_layout(model, flat_layout_for(o, shard_.size()), o.zero);
  buckets_ = make_buckets(model, o.bucket_mb, traits(o.zero).sharded() ? shard_.size() : 0,
                          bucket_of_unit_);
  zero_ = make_zero_strategy(o.zero, ZeroContext{ps_, shard_, alloc, buckets_, o.grad_reduce_dtype,
                                                 o.param_gather_dtype, replicas_});
  zero_->set_pipeline_stage(!model.holds_whole_model());
  model_.add_hooks(this);
}

DataParallel::~DataParallel() {
  model_.remove_hooks(this);
  // Let reductions in flight finish before their buffers go away; errors are already reported.
  for (Reduction& r : pending_) {
    try {
      r.work.wait();
    } catch (...) {
    }
  }
}

void DataParallel::create_optimizer(const OptimizerFactory& make) {
  opt_ = make(zero_->segments(), zero_->state_elems());
}

void DataParallel::load_optimizer_state(const io::SafetensorsFile& file) {
  std::vector<io::SliceRead> reads;
  for (auto& [kind, buf] : opt_->state_buffers())
    for (const optim::Segment& s : opt_->segments()) {
      const nn::ParamInfo& info = ps_.infos()[s.param];
      append_slice_reads(reads, kind + "." + info.name, info, s.param_offset, s.n,
                         buf.f32() + s.state_offset);
    }
  io::load_slices(file, reads, " (was the checkpoint written with another --optimizer?)");
}

// ---- the step --------------------------------------------------------------------------------

void DataParallel::begin_step() {
  // The last optimizer step left every gradient zero (ZeRO-0), unless none ran since.
  if (!std::exchange(grads_zeroed_by_step_, false)) zero_->zero_grads();
}

void DataParallel::end_backward() {
  for (int b : ready_) launch(b);
  ready_.clear();
  drain(0);
  if (replicas_) {
    TraceSpan span("all_reduce gradient shards over replicas", "comm");
    zero_->reduce_over_replicas();
  }
}

bool DataParallel::counts_once() const {
  // Replicas of a segment are identical: count one (ZeRO-0: data-parallel rank 0's; HSDP: the
  // first replica's shard).
  return zero_->sharded() ? replicas_ == nullptr || replicas_->rank() == 0 : dp_.rank() == 0;
}

double DataParallel::grad_norm_contribution() {
  const double local = optim::grad_sum_of_squares(opt_->segments(), ps_);
  return counts_once() ? local : 0.0;
}

double DataParallel::grad_norm() {
  const double local = optim::grad_sum_of_squares(opt_->segments(), ps_);
  if (!zero_->sharded()) return std::sqrt(local);
  return std::sqrt(all_reduce_sum(dp_, counts_once() ? local : 0.0));
}

void DataParallel::sum_marked_gradients(comm::Communicator& group, bool nn::GradReduction::*flag,
                                        const char* label) {
  // The marked parameters' local elements, packed: parameter i at packed_at[i].
  std::vector<int64_t> packed_at(static_cast<size_t>(ps_.size()), -1);
  int64_t total = 0;
  for (int i = 0; i < ps_.size(); ++i)
    if (ps_.infos()[i].reduction.*flag) packed_at[i] = total, total += ps_.infos()[i].local_numel();
  if (total == 0 || group.size() == 1) return;
  TraceSpan span(label, "reduce");
  Tensor packed =
      Tensor::zeros({total}, DType::F32, MemCategory::Buffers, "marked_gradients", &alloc_);
  float* f = packed.f32();
  if (counts_once())
    for (const optim::Segment& s : opt_->segments())
      if (packed_at[s.param] >= 0)
        std::copy(s.grad, s.grad + s.n, f + packed_at[s.param] + s.param_offset);
  group.all_reduce(f, static_cast<size_t>(total), DType::F32).wait();
  for (const optim::Segment& s : opt_->segments())
    if (packed_at[s.param] >= 0) {
      const float* from = f + packed_at[s.param] + s.param_offset;
      std::copy(from, from + s.n, s.grad);
    }
}

void DataParallel::clip(double norm, double max_norm) {
  opt_->scale_gradients_in_next_step(optim::clip_scale(norm, max_norm));
}

void DataParallel::optimizer_step(float lr) {
  // Unsharded (ZeRO-0), the segments are every parameter's whole gradient, so the step itself can
  // zero them for the next one (Optimizer::zero_gradients_in_next_step). The sharded stages zero
  // more than their optimizer reads (the full gradients, the shard buffers) and keep begin_step's.
  const bool zero_in_step = !zero_->sharded();
  if (zero_in_step) opt_->zero_gradients_in_next_step();
  {
    TraceSpan span("optimizer step", "optimizer");
    opt_->step(lr);
  }
  grads_zeroed_by_step_ = zero_in_step;
  zero_->after_optimizer_step();
  // The values changed (sharded: in the gather too). The step wrote the bf16 copies of the weights
  // its segments hold whole (optim::Segment::bf16: ZeRO-0's); the next forward converts the others.
  ps_.bf16_copies_stale();
  for (const optim::Segment& s : opt_->segments())
    if (s.bf16 != nullptr && s.param_offset == 0 && s.n == ps_.infos()[s.param].local_numel())
      ps_.mark_bf16_copy_current(s.param);
}

// ---- hooks -----------------------------------------------------------------------------------

template <typename F>
void DataParallel::for_each_bucket_of(int unit, F f) {
  const int own = bucket_of_unit_[unit - model_.first_unit()];
  if (own < 0) return;  // no parameters of this engine's set in the unit
  f(own);
  const int tied = model_.tied_unit(unit);
  if (tied >= 0 && bucket_of_unit_[tied - model_.first_unit()] != own)
    f(bucket_of_unit_[tied - model_.first_unit()]);
}

void DataParallel::before_forward(int unit) {
  for_each_bucket_of(unit, [&](int bi) {
    zero_->acquire_params(bi);
    // Buckets are in backward order: the next one forward has the lower index.
    if (unit == buckets_[bi].first_unit) zero_->prefetch_params(bi - 1);
  });
}

void DataParallel::after_forward(int unit) {
  for_each_bucket_of(unit, [&](int bi) {
    Bucket& b = buckets_[bi];
    if (++b.fwd_done < b.users) return;
    b.fwd_done = 0;
    zero_->release_params(bi);
  });
}

void DataParallel::before_backward(int unit) {
  for_each_bucket_of(unit, [&](int bi) {
    zero_->acquire_params(bi);
    zero_->acquire_grads(bi);
    if (unit == buckets_[bi].last_unit) zero_->prefetch_params(bi + 1);
  });
}

void DataParallel::before_backward_weight(int unit) {
  // Zero-bubble W pass: the parameters stay from the BI pass (ZeRO-3 releases them when the
  // bucket's gradients are final); the gradients need their buffer again (ZeRO-2/3 may have
  // reduced the last one during another micro-batch's W).
  for_each_bucket_of(unit, [&](int bi) { zero_->acquire_grads(bi); });
}

void DataParallel::after_backward(int unit, const nn::BackwardPass& pass) {
  for_each_bucket_of(unit, [&](int bi) {
    Bucket& b = buckets_[bi];
    if (++b.bwd_done < b.users) return;
    b.bwd_done = 0;
    bucket_backward_done(bi, pass);
  });
}

void DataParallel::bucket_backward_done(int bi, const nn::BackwardPass& pass) {
  zero_->release_params(bi);
  if (!zero_->reduce_every_micro_batch() && !pass.last_micro_batch) return;
  if (o_.overlap)
    launch(bi);
  else if (std::find(ready_.begin(), ready_.end(), bi) == ready_.end())
    ready_.push_back(bi);  // ZeRO-2/3: later micro-batches accumulate into the same buffer
  drain(2);                // keep at most two buckets in flight (bounds ZeRO-2/3 memory)
}

void DataParallel::launch(int bi) {
  pending_.push_back(zero_->launch(bi));
}

void DataParallel::drain(size_t keep) {
  while (pending_.size() > keep || (!pending_.empty() && pending_.front().work.is_completed())) {
    Reduction& r = pending_.front();
    r.work.wait();
    if (Tracer* t = Tracer::current()) t->record(r.name, "comm", 1, r.launched, TraceClock::now());
    zero_->finish(r);
    pending_.pop_front();
  }
}

}  // namespace tessera::parallel
