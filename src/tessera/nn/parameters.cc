#include "tessera/nn/parameters.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/bf16.h"
#include "tessera/kernels/parallel_rows.h"

namespace tessera::nn {

namespace {
constexpr int64_t kAlignFloats = 16;  // 64 bytes

Shape local_shape_of(const std::string& name, const Shape& g, const ShardSpec& s) {
  if (s.dim < 0) return g;
  TESSERA_CHECK_AS(ShapeError, s.dim < static_cast<int>(g.size()), "parameter ", name,
                   ": shard dimension ", s.dim, " out of range for shape ", shape_str(g));
  int64_t d = g[s.dim];
  TESSERA_CHECK_AS(ShapeError, s.blocks >= 1 && d % s.blocks == 0, "parameter ", name,
                   ": dimension ", s.dim, " of size ", d, " does not split into ", s.blocks,
                   " equal blocks");
  int64_t block = d / s.blocks;
  TESSERA_CHECK_AS(ShapeError, s.offset >= 0 && s.length >= 0 && s.offset + s.length <= block,
                   "parameter ", name, ": shard [", s.offset, ", ", s.offset + s.length,
                   ") does not fit in a block of ", block);
  Shape l = g;
  l[s.dim] = s.blocks * s.length;
  return l;
}
}  // namespace

int64_t ParamInfo::global_index(int64_t i) const {
  if (shard.dim < 0) return i;
  // Decompose i into (outer, local coordinate along dim, inner) and map the coordinate.
  int64_t inner = 1;
  for (size_t k = shard.dim + 1; k < global_shape.size(); ++k) inner *= global_shape[k];
  int64_t local_d = local_shape[shard.dim];
  int64_t global_d = global_shape[shard.dim];
  int64_t in = i % inner;
  int64_t rest = i / inner;
  int64_t c = rest % local_d;
  int64_t outer = rest / local_d;
  int64_t block = c / shard.length, within = c % shard.length;
  int64_t gc = block * (global_d / shard.blocks) + shard.offset + within;
  return (outer * global_d + gc) * inner + in;
}

std::vector<std::pair<int64_t, int64_t>> ParamInfo::global_runs(int64_t local_begin,
                                                                int64_t n) const {
  std::vector<std::pair<int64_t, int64_t>> runs;
  if (n <= 0) return runs;
  if (shard.dim < 0) return {{local_begin, n}};
  for (int64_t i = local_begin; i < local_begin + n; ++i) {
    const int64_t g = global_index(i);
    if (!runs.empty() && runs.back().first + runs.back().second == g)
      ++runs.back().second;
    else
      runs.emplace_back(g, 1);
  }
  return runs;
}

int ParameterSet::add(std::string name, Shape global_shape, Init init, float init_std,
                      bool weight_decay, ShardSpec shard) {
  TESSERA_ASSERT(!materialized(), "parameter ", name, " registered after materialize()");
  TESSERA_ASSERT(!by_name_.count(name), "parameter ", name, " registered twice");
  ParamInfo p;
  p.name = std::move(name);
  p.global_shape = std::move(global_shape);
  p.shard = shard;
  p.local_shape = local_shape_of(p.name, p.global_shape, shard);
  p.offset = numel_;
  p.init = init;
  p.init_std = init_std;
  p.weight_decay = weight_decay;
  numel_ += (p.local_numel() + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  by_name_.emplace(p.name, static_cast<int>(infos_.size()));
  infos_.push_back(std::move(p));
  return static_cast<int>(infos_.size()) - 1;
}

void ParameterSet::pad_to_multiple(int64_t floats) {
  TESSERA_ASSERT(!materialized(), "pad_to_multiple() after materialize()");
  TESSERA_ASSERT(floats > 0, "pad_to_multiple(", floats, ")");
  numel_ = (numel_ + floats - 1) / floats * floats;
}

void ParameterSet::materialize(Allocator& alloc, bool full_params, bool full_grads,
                               bool bf16_copies) {
  TESSERA_ASSERT(!materialized(), "parameters materialized twice");
  if (full_params)
    flat_params_ =
        Tensor::zeros({numel_}, DType::F32, MemCategory::Parameters, "parameters", &alloc);
  if (full_grads)
    flat_grads_ = Tensor::zeros({numel_}, DType::F32, MemCategory::Gradients, "gradients", &alloc);
  param_ptr_.assign(infos_.size(), nullptr);
  grad_ptr_.assign(infos_.size(), nullptr);
  for (size_t i = 0; i < infos_.size(); ++i) {
    if (full_params) param_ptr_[i] = flat_params_.f32() + infos_[i].offset;
    if (full_grads) grad_ptr_[i] = flat_grads_.f32() + infos_[i].offset;
  }
  gemm_weight_.resize(infos_.size(), false);
  if (bf16_copies) {
    constexpr int64_t kAlign = 32;  // bf16 elements: 64 bytes
    std::vector<int64_t> at(infos_.size(), -1);
    int64_t n = 0;
    for (size_t i = 0; i < infos_.size(); ++i)
      if (gemm_weight_[i]) {
        at[i] = n;
        n += (infos_[i].local_numel() + kAlign - 1) / kAlign * kAlign;
      }
    if (n > 0) {
      bf16_copies_ = Tensor::zeros({n}, DType::BF16, MemCategory::Parameters,
                                   "parameters.bf16_copies", &alloc);
      bf16_ptr_.assign(infos_.size(), nullptr);
      bf16_current_.assign(infos_.size(), 0);
      for (size_t i = 0; i < infos_.size(); ++i)
        if (at[i] >= 0) bf16_ptr_[i] = bf16_copies_.data<uint16_t>() + at[i];
    }
  }
  materialized_ = true;
}

void ParameterSet::mark_gemm_weight(int i) {
  TESSERA_ASSERT(!materialized(), "mark_gemm_weight() after materialize()");
  TESSERA_ASSERT(i >= 0 && i < size(), "mark_gemm_weight(", i, ") of ", size(), " parameters");
  gemm_weight_.resize(infos_.size(), false);
  gemm_weight_[static_cast<size_t>(i)] = true;
}

void ParameterSet::refresh_bf16_copy(int i) const {
  if (bf16_ptr_.empty() || bf16_ptr_[i] == nullptr) return;
  TESSERA_ASSERT(param_ptr_[i] != nullptr, "a bf16 copy of ", infos_[i].name,
                 " without its values");
  if (bf16_current_[i]) return;
  kernels::f32_to_bf16(bf16_ptr_[i], param_ptr_[i], infos_[i].local_numel());
  bf16_current_[i] = 1;
}

void ParameterSet::mark_bf16_copy_current(int i) const {
  TESSERA_ASSERT(bf16_copy(i) != nullptr, "parameter ", infos_[i].name, " has no bf16 copy");
  bf16_current_[i] = 1;
}

void ParameterSet::bf16_copies_stale() const {
  std::fill(bf16_current_.begin(), bf16_current_.end(), 0);
}

// Initial values are a pure function of each element's global index, so a range splits into
// pieces that threads fill independently, bitwise what one thread writes (GPT-2 124M's 124 M
// values took 5 s on one thread).
void ParameterSet::initial_values(uint64_t seed, int64_t begin, int64_t end, float* out) const {
  kernels::parallel_rows(end - begin, 1, [&](int64_t first, int64_t last) {
    fill_initial_values(seed, begin + first, begin + last, out + first);
  });
}

void ParameterSet::fill_initial_values(uint64_t seed, int64_t begin, int64_t end,
                                       float* out) const {
  for (int64_t i = 0; i < end - begin; ++i) out[i] = 0.0f;
  auto [first, last] = params_in(begin, end);
  // params_in returns parameters wholly inside; include the ones that straddle the edges too.
  if (first > 0) --first;
  if (last < size()) ++last;
  for (int idx = first; idx < last; ++idx) {
    const ParamInfo& p = infos_[idx];
    int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.local_numel());
    if (lo >= hi) continue;
    float* w = out + (lo - begin);
    int64_t n = hi - lo, first_local = lo - p.offset;
    uint64_t stream = stable_hash(p.name);
    switch (p.init) {
      case Init::Zeros:
        break;
      case Init::Ones:
        for (int64_t i = 0; i < n; ++i) w[i] = 1.0f;
        break;
      case Init::Normal:
        if (p.shard.dim < 0) {
          philox_fill_normal(w, n, seed, stream, static_cast<uint64_t>(first_local), 0.0f,
                             p.init_std);
        } else {
          for (int64_t i = 0; i < n; ++i)
            w[i] =
                p.init_std *
                philox_normal(seed, stream, static_cast<uint64_t>(p.global_index(first_local + i)));
        }
        break;
    }
  }
}

void ParameterSet::initialize(uint64_t seed) {
  TESSERA_CHECK(materialized() && flat_params_.defined(),
                "initialize() needs the full parameter buffer (materialize first)");
  initial_values(seed, 0, numel_, flat_params_.f32());
  bf16_copies_stale();
}

std::pair<int, int> ParameterSet::params_in(int64_t begin, int64_t end) const {
  int first = 0;
  while (first < size() && infos_[first].offset < begin) ++first;
  int last = first;
  while (last < size() && infos_[last].offset + infos_[last].local_numel() <= end &&
         infos_[last].offset < end)
    ++last;
  return {first, last};
}

int64_t ParameterSet::global_numel() const {
  int64_t n = 0;
  for (const ParamInfo& p : infos_) n += p.global_numel();
  return n;
}

Tensor ParameterSet::param(int i) const {
  TESSERA_CHECK(flat_params_.defined(), "parameters used before materialize()");
  const ParamInfo& p = infos_.at(i);
  return flat_params_.view(p.offset, p.local_shape);
}

Tensor ParameterSet::grad(int i) const {
  TESSERA_CHECK(flat_grads_.defined(), "gradients used before materialize()");
  const ParamInfo& p = infos_.at(i);
  return flat_grads_.view(p.offset, p.local_shape);
}

int ParameterSet::index(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  TESSERA_CHECK_AS(ConfigError, it != by_name_.end(), "unknown parameter '", name, "'");
  return it->second;
}

bool ParameterSet::contains(std::string_view name) const {
  return by_name_.count(std::string(name)) != 0;
}

// Spread over the rank's compute threads: one thread alone writes the 400 MB of a 100M-parameter
// model's gradients at well under the memory's speed.
void ParameterSet::zero_grads() {
  if (!flat_grads_.defined()) return;
  float* g = flat_grads_.f32();
  kernels::parallel_rows(flat_grads_.numel(), 1, [&](int64_t first, int64_t end) {
    std::memset(g + first, 0, sizeof(float) * static_cast<size_t>(end - first));
  });
}

}  // namespace tessera::nn
