#include "tessera/parallel/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "tessera/core/error.h"
#include "tessera/io/tensor_set.h"
#include "tessera/optim/grad_clip.h"
#include "tessera/parallel/gather.h"

namespace tessera::parallel {

nn::GPTLayout gpt_layout_for(const DataParallelOptions& o, int dp_size) {
  nn::GPTLayout l;
  l.unit_alignment = 16 * static_cast<int64_t>(o.zero > 0 ? dp_size : 1);
  l.full_params = o.zero < 3;
  l.full_grads = o.zero < 2;
  return l;
}

DataParallel::DataParallel(nn::GPT& model, comm::Communicator& dp, const DataParallelOptions& o,
                           Allocator& alloc)
    : model_(model),
      ps_(model.params()),
      dp_(dp),
      o_(o),
      alloc_(alloc),
      rank_(dp.rank()),
      size_(dp.size()) {
  TESSERA_CHECK_AS(ConfigError, o.zero >= 0 && o.zero <= 3, "--zero must be 0, 1, 2 or 3, got ",
                   o.zero);
  TESSERA_CHECK_AS(ConfigError, o.bucket_mb > 0, "--bucket-mb must be positive");
  const int U = model.num_units();
  // Buckets: whole units, in backward order (last unit first), each about bucket_mb.
  const int64_t target = static_cast<int64_t>(o.bucket_mb * 1024 * 1024 / 4);
  bucket_of_unit_.assign(U, -1);
  int hi = U - 1;
  while (hi >= 0) {
    int lo = hi;
    while (lo > 0 && model.unit_begin(hi + 1) - model.unit_begin(lo) < target) --lo;
    Bucket b;
    b.first_unit = lo;
    b.last_unit = hi;
    b.begin = model.unit_begin(lo);
    b.end = model.unit_begin(hi + 1);
    auto [fp, lp] = ps_.params_in(b.begin, b.end);
    b.first_param = fp;
    b.last_param = lp;
    TESSERA_CHECK(o.zero == 0 || (b.end - b.begin) % size_ == 0, "internal: bucket of ",
                  b.end - b.begin, " elements does not split into ", size_,
                  " shards; build the model with gpt_layout_for()");
    b.shard = o.zero > 0 ? (b.end - b.begin) / size_ : 0;
    for (int u = lo; u <= hi; ++u) bucket_of_unit_[u] = static_cast<int>(buckets_.size());
    buckets_.push_back(std::move(b));
    hi = lo - 1;
  }
  // Packed shard offsets, in flat order (buckets_ is in backward order).
  for (int i = static_cast<int>(buckets_.size()) - 1; i >= 0; --i) {
    buckets_[i].shard_offset = shard_elems_;
    shard_elems_ += buckets_[i].shard;
  }
  if (o.zero >= 3)
    param_shard_ = Tensor::zeros({shard_elems_}, DType::F32, MemCategory::Parameters,
                                 "zero3.parameter_shard", &alloc_);
  if (o.zero >= 2)
    grad_shard_ = Tensor::zeros({shard_elems_}, DType::F32, MemCategory::Gradients,
                                "zero.gradient_shard", &alloc_);
  fwd_start_.resize(U);
  bwd_start_.resize(U);
  model_.set_hooks(this);
}

DataParallel::~DataParallel() {
  model_.set_hooks(nullptr);
  // Let in-flight operations finish before their buffers go away; errors are already reported.
  for (Pending& p : pending_) {
    try {
      p.work.wait();
    } catch (...) {
    }
  }
  for (Bucket& b : buckets_) {
    if (!b.gathering) continue;
    try {
      b.gather.wait();
    } catch (...) {
    }
  }
}

template <typename F>
void DataParallel::for_each_shard_range(F f) const {
  for (int i = static_cast<int>(buckets_.size()) - 1; i >= 0; --i) {
    const Bucket& b = buckets_[i];
    f(b, shard_begin(b), shard_begin(b) + b.shard, b.shard_offset);
  }
}

std::vector<optim::Segment> DataParallel::shard_segments() const {
  std::vector<optim::Segment> segs;
  for_each_shard_range([&](const Bucket& b, int64_t lo, int64_t hi, int64_t packed) {
    for (int i = b.first_param; i < b.last_param; ++i) {
      const nn::ParamInfo& info = ps_.infos()[i];
      int64_t s = std::max(lo, info.offset), e = std::min(hi, info.offset + info.local_numel());
      if (s >= e) continue;
      optim::Segment seg;
      seg.param = i;
      seg.param_offset = s - info.offset;
      seg.n = e - s;
      seg.state_offset = packed + (s - lo);
      seg.decay = info.weight_decay;
      seg.value =
          o_.zero >= 3 ? param_shard_.f32() + seg.state_offset : ps_.flat_params().f32() + s;
      seg.grad = o_.zero >= 2 ? grad_shard_.f32() + seg.state_offset : ps_.flat_grads().f32() + s;
      segs.push_back(seg);
    }
  });
  return segs;
}

void DataParallel::create_optimizer(const OptimizerFactory& make) {
  if (o_.zero == 0)
    opt_ = make(optim::whole_parameter_segments(ps_), ps_.numel());
  else
    opt_ = make(shard_segments(), shard_elems_);
}

// ---- weights ---------------------------------------------------------------------------------

void DataParallel::initialize(uint64_t seed) {
  if (o_.zero < 3) {
    ps_.initialize(seed);
    return;
  }
  for_each_shard_range([&](const Bucket&, int64_t lo, int64_t hi, int64_t packed) {
    ps_.initial_values(seed, lo, hi, param_shard_.f32() + packed);
  });
}

namespace {
// The name under which `name` is stored in `file` ("transformer." prefix allowed), or throws.
std::string stored_name(const io::SafetensorsFile& file, const std::string& name,
                        const Shape& shape) {
  std::string n = file.contains(name) ? name : "transformer." + name;
  TESSERA_CHECK_AS(IoError, file.contains(n), "'", file.path().string(), "' has no tensor '", name,
                   "'");
  TESSERA_CHECK_AS(IoError, file.shape(n) == shape, "tensor '", n, "' in '", file.path().string(),
                   "' has shape ", shape_str(file.shape(n)), " but the model expects ",
                   shape_str(shape));
  return n;
}
}  // namespace

io::NamedTensors DataParallel::parameter_views() const {
  io::NamedTensors views;
  for (int i = 0; i < ps_.size(); ++i) views.emplace_back(ps_.infos()[i].name, ps_.param(i));
  return views;
}

void DataParallel::load_weights(const io::SafetensorsFile& file) {
  if (o_.zero < 3) {
    io::load_into(file, parameter_views());
    return;
  }
  std::vector<std::string> names;
  for (const nn::ParamInfo& info : ps_.infos())
    names.push_back(stored_name(file, info.name, info.global_shape));
  for (const optim::Segment& s : shard_segments())
    file.read_slice_f32(names[s.param], s.param_offset, s.n, s.value);
}

void DataParallel::load_optimizer_state(const io::SafetensorsFile& file) {
  for (auto& [kind, buf] : opt_->state_buffers()) {
    for (const optim::Segment& s : opt_->segments()) {
      const nn::ParamInfo& info = ps_.infos()[s.param];
      const std::string name = kind + "." + info.name;
      TESSERA_CHECK_AS(IoError, file.contains(name), "'", file.path().string(),
                       "' has no optimizer state '", name,
                       "' (was the checkpoint written with another --optimizer?)");
      TESSERA_CHECK_AS(IoError, file.shape(name) == info.global_shape, "optimizer state '", name,
                       "' has shape ", shape_str(file.shape(name)), ", expected ",
                       shape_str(info.global_shape));
      file.read_slice_f32(name, s.param_offset, s.n, buf.f32() + s.state_offset);
    }
  }
}

io::NamedTensors DataParallel::full_weights() {
  if (o_.zero < 3) return parameter_views();
  io::NamedTensors out;
  Tensor full =
      Tensor::zeros({ps_.numel()}, DType::F32, MemCategory::Buffers, "checkpoint.weights", &alloc_);
  for_each_shard_range([&](const Bucket& b, int64_t, int64_t, int64_t packed) {
    dp_.all_gather(param_shard_.f32() + packed, full.f32() + b.begin, b.shard, DType::F32).wait();
  });
  for (const nn::ParamInfo& info : ps_.infos())
    out.emplace_back(info.name, full.view(info.offset, info.local_shape));
  return out;
}

io::NamedTensors DataParallel::full_optimizer_state() {
  if (o_.zero == 0) return opt_->state(ps_);
  io::NamedTensors out;
  for (auto& [kind, buf] : opt_->state_buffers()) {
    Tensor full = Tensor::zeros({ps_.numel()}, DType::F32, MemCategory::Buffers,
                                "checkpoint." + kind, &alloc_);
    for_each_shard_range([&](const Bucket& b, int64_t, int64_t, int64_t packed) {
      dp_.all_gather(buf.f32() + packed, full.f32() + b.begin, b.shard, DType::F32).wait();
    });
    for (const nn::ParamInfo& info : ps_.infos())
      out.emplace_back(kind + "." + info.name, full.view(info.offset, info.local_shape));
  }
  return out;
}

// ---- the step --------------------------------------------------------------------------------

void DataParallel::begin_step() {
  ps_.zero_grads();
  if (grad_shard_.defined()) grad_shard_.zero_();
}

void DataParallel::begin_micro_batch(bool last) {
  last_micro_ = last;
}

void DataParallel::end_backward() {
  for (int b : ready_) launch(b);
  ready_.clear();
  drain(0);
}

double DataParallel::grad_norm() {
  // Plain DP: every rank holds the same, already reduced, gradients.
  if (o_.zero == 0) return std::sqrt(optim::grad_sum_of_squares(ps_));
  double local = 0;
  const float* base = o_.zero == 1 ? ps_.flat_grads().f32() : grad_shard_.f32();
  for_each_shard_range([&](const Bucket&, int64_t lo, int64_t hi, int64_t packed) {
    const float* g = o_.zero == 1 ? base + lo : base + packed;
    for (int64_t i = 0; i < hi - lo; ++i) local += static_cast<double>(g[i]) * g[i];
  });
  return std::sqrt(all_reduce_sum(dp_, local));
}

void DataParallel::clip(double norm, double max_norm) {
  if (o_.zero == 0) {
    optim::clip_to_norm(ps_, norm, max_norm);
    return;
  }
  if (max_norm <= 0 || !(norm > max_norm)) return;
  const float scale = static_cast<float>(max_norm / (norm + 1e-6));  // as optim::clip_to_norm
  auto scale_range = [&](float* g, int64_t n) {
    for (int64_t i = 0; i < n; ++i) g[i] *= scale;
  };
  if (o_.zero == 1)
    for_each_shard_range([&](const Bucket&, int64_t lo, int64_t hi, int64_t) {
      scale_range(ps_.flat_grads().f32() + lo, hi - lo);
    });
  else
    scale_range(grad_shard_.f32(), shard_elems_);
}

void DataParallel::optimizer_step(float lr) {
  {
    TraceSpan span("optimizer step", "optimizer");
    opt_->step(lr);
  }
  if (o_.zero == 1 || o_.zero == 2) {
    // Every rank updated its shard: gather the full parameters again (in place).
    auto t0 = TraceClock::now();
    for_each_shard_range([&](const Bucket& b, int64_t lo, int64_t, int64_t) {
      float* p = ps_.flat_params().f32();
      dp_.all_gather(p + lo, p + b.begin, b.shard, DType::F32).wait();
      volume_.all_gather += 4.0 * (b.end - b.begin) * (size_ - 1) / size_;
    });
    trace_comm("all_gather parameters", t0);
  }
}

// ---- hooks -----------------------------------------------------------------------------------

void DataParallel::point_params(Bucket& b, float* base) {
  for (int i = b.first_param; i < b.last_param; ++i)
    ps_.set_param_data(i, base ? base + (ps_.infos()[i].offset - b.begin) : nullptr);
}

void DataParallel::point_grads(Bucket& b, float* base) {
  for (int i = b.first_param; i < b.last_param; ++i)
    ps_.set_grad_data(i, base ? base + (ps_.infos()[i].offset - b.begin) : nullptr);
}

void DataParallel::prefetch(int bi) {
  if (o_.zero < 3 || bi < 0 || bi >= num_buckets()) return;
  Bucket& b = buckets_[bi];
  if (b.params.defined()) return;
  b.params =
      Tensor::empty({b.end - b.begin}, DType::F32, MemCategory::Buffers, "zero3.gathered", &alloc_);
  comm::AllGatherOptions ao;
  ao.async = true;
  b.gather =
      dp_.all_gather(param_shard_.f32() + b.shard_offset, b.params.f32(), b.shard, DType::F32, ao);
  b.gathering = true;
  volume_.all_gather += 4.0 * (b.end - b.begin) * (size_ - 1) / size_;
}

void DataParallel::ensure_params(int bi) {
  if (o_.zero < 3) return;
  Bucket& b = buckets_[bi];
  if (!b.params.defined()) prefetch(bi);
  if (b.gathering) {
    auto t0 = TraceClock::now();
    b.gather.wait();
    b.gathering = false;
    trace_comm("all_gather parameters (wait)", t0);
    point_params(b, b.params.f32());
  }
}

void DataParallel::release_params(Bucket& b) {
  if (o_.zero < 3) return;
  point_params(b, nullptr);
  b.params = Tensor();
}

void DataParallel::ensure_grads(int bi) {
  if (o_.zero < 2) return;
  Bucket& b = buckets_[bi];
  if (b.grads.defined()) return;
  b.grads = Tensor::zeros({b.end - b.begin}, DType::F32, MemCategory::Buffers, "zero.grad_bucket",
                          &alloc_);
  point_grads(b, b.grads.f32());
}

void DataParallel::before_forward(int unit) {
  fwd_start_[unit] = TraceClock::now();
  int bi = bucket_of_unit_[unit];
  ensure_params(bi);
  // Buckets are in backward order, so the next one forward has the lower index.
  if (unit == buckets_[bi].first_unit || unit == 0) prefetch(bi - 1);
}

void DataParallel::after_forward(int unit) {
  if (Tracer::current())
    Tracer::current()->record(unit == 0 ? std::string("forward (embeddings, head)")
                                        : "forward unit " + std::to_string(unit),
                              "forward", 0, fwd_start_[unit], TraceClock::now());
  Bucket& b = buckets_[bucket_of_unit_[unit]];
  if (++b.fwd_done == b.units()) {
    b.fwd_done = 0;
    release_params(b);
  }
}

void DataParallel::before_backward(int unit) {
  bwd_start_[unit] = TraceClock::now();
  int bi = bucket_of_unit_[unit];
  ensure_params(bi);
  ensure_grads(bi);
  if (unit == buckets_[bi].last_unit || unit == 0) prefetch(bi + 1);
}

void DataParallel::after_backward(int unit) {
  if (Tracer::current())
    Tracer::current()->record(unit == 0 ? std::string("backward (head, embeddings)")
                                        : "backward unit " + std::to_string(unit),
                              "backward", 0, bwd_start_[unit], TraceClock::now());
  int bi = bucket_of_unit_[unit];
  Bucket& b = buckets_[bi];
  if (++b.bwd_done == b.units()) {
    b.bwd_done = 0;
    bucket_backward_done(bi);
  }
}

void DataParallel::bucket_backward_done(int bi) {
  Bucket& b = buckets_[bi];
  release_params(b);
  const bool communicate = o_.zero >= 2 || last_micro_;
  if (!communicate) return;
  if (o_.overlap)
    launch(bi);
  else
    ready_.push_back(bi);
  drain(2);  // keep at most two buckets in flight (bounds ZeRO-2/3 memory)
}

void DataParallel::launch(int bi) {
  Bucket& b = buckets_[bi];
  const int64_t len = b.end - b.begin;
  Pending p;
  p.bucket = bi;
  p.launched = TraceClock::now();
  if (o_.zero == 0) {
    comm::AllReduceOptions ao;
    ao.async = true;
    p.kind = PendingKind::AllReduce;
    p.work = dp_.all_reduce(ps_.flat_grads().f32() + b.begin, len, DType::F32, ao);
    volume_.all_reduce += 8.0 * len * (size_ - 1) / size_;
  } else {
    comm::ReduceScatterOptions ro;
    ro.async = true;
    float* base = o_.zero == 1 ? ps_.flat_grads().f32() + b.begin : b.grads.f32();
    p.kind =
        o_.zero == 1 ? PendingKind::ReduceScatterInPlace : PendingKind::ReduceScatterAccumulate;
    p.work = dp_.reduce_scatter(base, base + rank_ * b.shard, b.shard, DType::F32, ro);
    volume_.reduce_scatter += 4.0 * len * (size_ - 1) / size_;
    if (o_.zero >= 2) {
      p.buffer = std::move(b.grads);
      b.grads = Tensor();
      point_grads(b, nullptr);
    }
  }
  pending_.push_back(std::move(p));
}

void DataParallel::finish(Pending& p) {
  p.work.wait();
  const char* names[] = {"all_reduce gradients", "reduce_scatter gradients",
                         "reduce_scatter gradients", "all_gather"};
  trace_comm(names[static_cast<int>(p.kind)], p.launched);
  if (p.kind == PendingKind::ReduceScatterAccumulate) {
    const Bucket& b = buckets_[p.bucket];
    const float* src = p.buffer.f32() + rank_ * b.shard;
    float* dst = grad_shard_.f32() + b.shard_offset;
    for (int64_t i = 0; i < b.shard; ++i) dst[i] += src[i];
  }
}

void DataParallel::drain(size_t keep) {
  while (pending_.size() > keep || (!pending_.empty() && pending_.front().work.is_completed())) {
    finish(pending_.front());
    pending_.pop_front();
  }
}

void DataParallel::trace_comm(const char* name, TraceClock::time_point start) {
  if (Tracer* t = Tracer::current()) t->record(name, "comm", 1, start, TraceClock::now());
}

}  // namespace tessera::parallel
