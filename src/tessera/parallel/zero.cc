#include "tessera/parallel/zero.h"

#include <algorithm>

#include "tessera/comm/wire.h"
#include "tessera/core/error.h"

namespace tessera::parallel {

void append_slice_reads(std::vector<io::SliceRead>& reads, const std::string& name,
                        const nn::ParamInfo& info, int64_t local_begin, int64_t n, float* dst) {
  for (const auto& [global, len] : info.global_runs(local_begin, n)) {
    reads.push_back({name, info.global_shape, global, len, dst});
    dst += len;
  }
}

ZeroStrategy::ZeroStrategy(const ZeroContext& c) : c_(c), rank_(c.dp.rank()), size_(c.dp.size()) {
  for (auto it = c_.buckets.rbegin(); it != c_.buckets.rend(); ++it) {  // flat order
    it->shard_offset = shard_elems_;
    shard_elems_ += it->shard;
  }
}

io::NamedTensors ZeroStrategy::parameter_views() const {
  io::NamedTensors views;
  for (int i = 0; i < c_.ps.size(); ++i) views.emplace_back(c_.ps.infos()[i].name, c_.ps.param(i));
  return views;
}

void ZeroStrategy::initialize(uint64_t seed) {
  c_.ps.initialize(seed);
}

void ZeroStrategy::load_weights(const io::SafetensorsFile& file) {
  bool sharded = false;
  for (const nn::ParamInfo& info : c_.ps.infos()) sharded = sharded || !info.tp_replicated();
  if (!sharded) {
    io::TensorLoadOptions o;
    o.error_on_unexpected = !pipeline_stage_;
    io::load_into(file, parameter_views(), o);
    return;
  }
  // Tensor-parallel shards: each rank reads its runs of the full tensors.
  std::vector<io::SliceRead> reads;
  for (int i = 0; i < c_.ps.size(); ++i) {
    const nn::ParamInfo& info = c_.ps.infos()[i];
    append_slice_reads(reads, info.name, info, 0, info.local_numel(), c_.ps.param_data(i));
  }
  io::load_slices(file, reads);
}

io::NamedTensors ZeroStrategy::full_weights() {
  return parameter_views();
}

io::NamedTensors ZeroStrategy::full_optimizer_state(optim::Optimizer& opt) {
  io::NamedTensors out;
  for (auto& [kind, buf] : opt.state_buffers()) {
    io::NamedTensors part = gather_shards(buf.f32(), kind + ".", "checkpoint." + kind);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

io::NamedTensors ZeroStrategy::gather_shards(const float* packed, const std::string& prefix,
                                             const std::string& label) {
  Tensor full = Tensor::zeros({c_.ps.numel()}, DType::F32, MemCategory::Buffers, label, &c_.alloc);
  for_each_shard([&](const Bucket& b, int64_t, int64_t, int64_t offset) {
    c_.dp.all_gather(packed + offset, full.f32() + b.begin, b.shard, DType::F32).wait();
  });
  io::NamedTensors out;
  for (const nn::ParamInfo& info : c_.ps.infos())
    out.emplace_back(prefix + info.name, full.view(info.offset, info.local_shape));
  return out;
}

namespace {

// Points bucket b's parameters' values or gradients (`set`) into the bucket-sized buffer `base`
// (null: at nothing, the bucket's buffer is gone).
void point_bucket(nn::ParameterSet& ps, const Bucket& b, float* base,
                  void (nn::ParameterSet::*set)(int, float*)) {
  for (int i = b.first_param; i < b.last_param; ++i)
    (ps.*set)(i, base ? base + (ps.infos()[i].offset - b.begin) : nullptr);
}

// Stage 0: replicated parameters, gradients and optimizer state.
class Replicated : public ZeroStrategy {
 public:
  using ZeroStrategy::ZeroStrategy;
  ZeroStage stage() const override { return ZeroStage::None; }
  std::vector<optim::Segment> segments() const override {
    return optim::whole_parameter_segments(c_.ps);
  }
  int64_t state_elems() const override { return c_.ps.numel(); }
  io::NamedTensors full_optimizer_state(optim::Optimizer& opt) override { return opt.state(c_.ps); }
  Reduction launch(int bi) override {
    Bucket& b = c_.buckets[bi];
    comm::AllReduceOptions o;
    o.async = true;
    float* grads = c_.ps.flat_grads().f32() + b.begin;
    if (c_.grad_dtype == DType::BF16) {
      Tensor wire = comm::to_wire(grads, b.size(), "zero.bf16_gradients", &c_.alloc);
      comm::Work w = c_.dp.all_reduce(wire.raw(), b.size(), DType::BF16, o);
      return Reduction{bi,
                       std::move(w),
                       Tensor(),
                       std::move(wire),
                       "all_reduce gradients (bf16)",
                       TraceClock::now()};
    }
    return Reduction{bi,
                     c_.dp.all_reduce(grads, b.size(), DType::F32, o),
                     Tensor(),
                     Tensor(),
                     "all_reduce gradients",
                     TraceClock::now()};
  }
  void finish(Reduction& r) override {
    if (!r.wire.defined()) return;
    const Bucket& b = c_.buckets[r.bucket];
    comm::from_wire(c_.ps.flat_grads().f32() + b.begin, r.wire, 0, b.size());
  }
};

// Stage 1: each rank updates its shard with its shard of the optimizer state.
class ShardedOptimizerState : public ZeroStrategy {
 public:
  using ZeroStrategy::ZeroStrategy;
  ZeroStage stage() const override { return ZeroStage::OptimizerState; }
  std::vector<optim::Segment> segments() const override {
    std::vector<optim::Segment> segs;
    for_each_shard([&](const Bucket& b, int64_t lo, int64_t hi, int64_t packed) {
      for (int i = b.first_param; i < b.last_param; ++i) {
        const nn::ParamInfo& info = c_.ps.infos()[i];
        const int64_t s = std::max(lo, info.offset);
        const int64_t e = std::min(hi, info.offset + info.local_numel());
        if (s >= e) continue;
        optim::Segment seg;
        seg.param = i;
        seg.param_offset = s - info.offset;
        seg.n = e - s;
        seg.state_offset = packed + (s - lo);
        seg.decay = info.weight_decay;
        seg.value = value_at(s, seg.state_offset);
        seg.grad = grad_at(s, seg.state_offset);
        segs.push_back(seg);
      }
    });
    return segs;
  }
  int64_t state_elems() const override { return shard_elems_; }
  Reduction launch(int bi) override {
    Bucket& b = c_.buckets[bi];
    return reduce_scatter(bi, c_.ps.flat_grads().f32() + b.begin, Tensor());
  }
  void finish(Reduction& r) override {  // bf16: widen this rank's reduced shard in place
    if (!r.wire.defined()) return;
    const Bucket& b = c_.buckets[r.bucket];
    comm::from_wire(c_.ps.flat_grads().f32() + b.begin + rank_ * b.shard, r.wire, rank_ * b.shard,
                    b.shard);
  }
  void reduce_over_replicas() override {  // each bucket's shard, inside the flat gradients
    if (!c_.replicas || c_.replicas->size() == 1) return;
    std::vector<comm::Work> works;
    for_each_shard([&](const Bucket& b, int64_t lo, int64_t, int64_t) {
      comm::AllReduceOptions o;
      o.async = true;
      works.push_back(c_.replicas->all_reduce(c_.ps.flat_grads().f32() + lo,
                                              static_cast<size_t>(b.shard), DType::F32, o));
    });
    for (comm::Work& w : works) w.wait();
  }
  void after_optimizer_step() override {
    // Every rank updated its shard: gather the full parameters again (in place).
    const auto t0 = TraceClock::now();
    float* p = c_.ps.flat_params().f32();
    for_each_shard([&](const Bucket& b, int64_t lo, int64_t, int64_t) {
      c_.dp.all_gather(p + lo, p + b.begin, b.shard, DType::F32).wait();
    });
    if (Tracer* t = Tracer::current())
      t->record("all_gather parameters", "comm", 1, t0, TraceClock::now());
  }

 protected:
  // Where the optimizer finds the values / gradients of flat element `flat`, whose shard
  // position is `packed`.
  virtual float* value_at(int64_t flat, int64_t) const { return c_.ps.flat_params().f32() + flat; }
  virtual float* grad_at(int64_t flat, int64_t) const { return c_.ps.flat_grads().f32() + flat; }
  // Reduce-scatters a bucket-sized gradient buffer into its rank's shard, which lies inside it
  // (fp32), or, under bf16, a bf16 copy of it into the copy's shard (Reduction::wire), which
  // finish() widens. `keep` stays alive until the reduction is done.
  Reduction reduce_scatter(int bi, float* base, Tensor keep) {
    const Bucket& b = c_.buckets[bi];
    comm::ReduceScatterOptions o;
    o.async = true;
    if (c_.grad_dtype == DType::BF16) {
      Tensor wire = comm::to_wire(base, b.size(), "zero.bf16_gradients", &c_.alloc);
      uint16_t* w = wire.data<uint16_t>();
      comm::Work work = c_.dp.reduce_scatter(w, w + rank_ * b.shard, b.shard, DType::BF16, o);
      return Reduction{bi,
                       std::move(work),
                       Tensor(),
                       std::move(wire),
                       "reduce_scatter gradients (bf16)",
                       TraceClock::now()};
    }
    comm::Work work = c_.dp.reduce_scatter(base, base + rank_ * b.shard, b.shard, DType::F32, o);
    return Reduction{bi,
                     std::move(work),
                     std::move(keep),
                     Tensor(),
                     "reduce_scatter gradients",
                     TraceClock::now()};
  }
};

// Stage 2: gradients live in a bucket buffer only during the bucket's backward.
class ShardedGradients : public ShardedOptimizerState {
 public:
  explicit ShardedGradients(const ZeroContext& c) : ShardedOptimizerState(c) {
    grad_shard_ = Tensor::zeros({shard_elems_}, DType::F32, MemCategory::Gradients,
                                "zero.gradient_shard", &c_.alloc);
  }
  ZeroStage stage() const override { return ZeroStage::Gradients; }
  void zero_grads() override {
    c_.ps.zero_grads();
    grad_shard_.zero_();
  }
  void reduce_over_replicas() override {  // the packed shards: one call
    if (!c_.replicas || c_.replicas->size() == 1) return;
    c_.replicas->all_reduce(grad_shard_.f32(), static_cast<size_t>(shard_elems_), DType::F32)
        .wait();
  }
  void acquire_grads(int bi) override {
    Bucket& b = c_.buckets[bi];
    if (b.grads.defined()) return;
    b.grads =
        Tensor::zeros({b.size()}, DType::F32, MemCategory::Buffers, "zero.grad_bucket", &c_.alloc);
    point_grads(b, b.grads.f32());
  }
  Reduction launch(int bi) override {
    Bucket& b = c_.buckets[bi];
    Reduction r = reduce_scatter(bi, b.grads.f32(), b.grads);
    b.grads = Tensor();  // under bf16 the fp32 bucket is free once copied onto the wire
    point_grads(b, nullptr);
    return r;
  }
  void finish(Reduction& r) override {  // ACCUMULATES the reduced shard into this rank's own
    const Bucket& b = c_.buckets[r.bucket];
    float* dst = grad_shard_.f32() + b.shard_offset;
    if (r.wire.defined()) {
      comm::add_from_wire(dst, r.wire, rank_ * b.shard, b.shard);
    } else {
      const float* src = r.buffer.f32() + rank_ * b.shard;
      for (int64_t i = 0; i < b.shard; ++i) dst[i] += src[i];
    }
  }

 protected:
  float* grad_at(int64_t, int64_t packed) const override { return grad_shard_.f32() + packed; }
  void point_grads(const Bucket& b, float* base) {
    point_bucket(c_.ps, b, base, &nn::ParameterSet::set_grad_data);
  }
  Tensor grad_shard_;
};

// Stage 3: parameters too are sharded and gathered bucket by bucket while in use.
class ShardedParameters : public ShardedGradients {
 public:
  explicit ShardedParameters(const ZeroContext& c) : ShardedGradients(c) {
    param_shard_ = Tensor::zeros({shard_elems_}, DType::F32, MemCategory::Parameters,
                                 "zero3.parameter_shard", &c_.alloc);
  }
  ~ShardedParameters() override {
    for (Bucket& b : c_.buckets) {  // let prefetches finish before their buffers go away
      if (!b.gathering) continue;
      try {
        b.gather.wait();
      } catch (...) {  // already reported by whoever failed first
      }
    }
  }
  ZeroStage stage() const override { return ZeroStage::Parameters; }
  void initialize(uint64_t seed) override {
    for_each_shard([&](const Bucket&, int64_t lo, int64_t hi, int64_t packed) {
      c_.ps.initial_values(seed, lo, hi, param_shard_.f32() + packed);
    });
  }
  void load_weights(const io::SafetensorsFile& file) override {
    std::vector<io::SliceRead> reads;
    for (const optim::Segment& s : segments()) {
      const nn::ParamInfo& info = c_.ps.infos()[s.param];
      append_slice_reads(reads, info.name, info, s.param_offset, s.n, s.value);
    }
    io::load_slices(file, reads);
  }
  io::NamedTensors full_weights() override {
    return gather_shards(param_shard_.f32(), "", "checkpoint.weights");
  }
  void after_optimizer_step() override {}  // nothing to gather: parameters stay sharded
  // Starts gathering bucket bi: into its fp32 working copy, or under a bf16 gather into a bf16
  // wire (this rank's shard rounded in place first), widened by acquire_params.
  void prefetch_params(int bi) override {
    if (bi < 0 || bi >= static_cast<int>(c_.buckets.size())) return;
    Bucket& b = c_.buckets[bi];
    if (b.params.defined() || b.params_wire.defined()) return;
    comm::AllGatherOptions o;
    o.async = true;
    const float* shard = param_shard_.f32() + b.shard_offset;
    if (c_.param_dtype == DType::BF16) {
      b.params_wire = comm::wire_buffer(b.size(), "zero3.gathered_bf16", &c_.alloc);
      comm::to_wire(b.params_wire, rank_ * b.shard, shard, b.shard);
      uint16_t* w = b.params_wire.data<uint16_t>();
      b.gather = c_.dp.all_gather(w + rank_ * b.shard, w, b.shard, DType::BF16, o);  // in place
    } else {
      b.params =
          Tensor::empty({b.size()}, DType::F32, MemCategory::Buffers, "zero3.gathered", &c_.alloc);
      b.gather = c_.dp.all_gather(shard, b.params.f32(), b.shard, DType::F32, o);
    }
    b.gathering = true;
  }
  void acquire_params(int bi) override {
    Bucket& b = c_.buckets[bi];
    if (!b.params.defined() && !b.params_wire.defined()) prefetch_params(bi);
    if (!b.gathering) return;
    const auto t0 = TraceClock::now();
    b.gather.wait();
    b.gathering = false;
    if (Tracer* t = Tracer::current())
      t->record("all_gather parameters (wait)", "comm", 1, t0, TraceClock::now());
    if (b.params_wire.defined()) {  // widen: the working copy holds the bf16 values
      b.params =
          Tensor::empty({b.size()}, DType::F32, MemCategory::Buffers, "zero3.gathered", &c_.alloc);
      comm::from_wire(b.params.f32(), b.params_wire, 0, b.size());
      b.params_wire = Tensor();
    }
    point_params(b, b.params.f32());
  }
  void release_params(int bi) override {
    Bucket& b = c_.buckets[bi];
    point_params(b, nullptr);
    b.params = Tensor();
  }

 protected:
  float* value_at(int64_t, int64_t packed) const override { return param_shard_.f32() + packed; }
  void point_params(const Bucket& b, float* base) {
    point_bucket(c_.ps, b, base, &nn::ParameterSet::set_param_data);
  }
  Tensor param_shard_;
};

}  // namespace

std::unique_ptr<ZeroStrategy> make_zero_strategy(ZeroStage stage, const ZeroContext& c) {
  switch (stage) {
    case ZeroStage::None:
      return std::make_unique<Replicated>(c);
    case ZeroStage::OptimizerState:
      return std::make_unique<ShardedOptimizerState>(c);
    case ZeroStage::Gradients:
      return std::make_unique<ShardedGradients>(c);
    case ZeroStage::Parameters:
      break;
  }
  return std::make_unique<ShardedParameters>(c);
}

}  // namespace tessera::parallel
