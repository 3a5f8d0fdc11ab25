#include "tessera/nn/tensor_parallel.h"

#include <algorithm>
#include <cstring>

#include "tessera/comm/wire.h"
#include "tessera/core/error.h"
#include "tessera/core/trace.h"

namespace tessera::nn {

namespace {
// Activations (and their gradients) travel in s.wire (comm/wire.h).
float* sum_over_group(const TensorSplit& s, float* x, int64_t n) {
  if (s.size() == 1 || n == 0) return x;
  TraceSpan span("tp all-reduce", "comm", 1);
  comm::all_reduce_as(s.wire, s.group, x, n);
  return x;
}

float* all_gather_rows(const TensorSplit& s, const float* slice, float* full,
                       const TokenRange& rows, int64_t width) {
  const int64_t count = rows.per * width;
  if (s.size() == 1) {
    if (slice != full && count > 0)
      std::memcpy(full, slice, sizeof(float) * static_cast<size_t>(count));
    return full;
  }
  TESSERA_ASSERT(rows.ranks == s.size(), "token range of ", rows.ranks, " ranks in a group of ",
                 s.size());
  TraceSpan span("tp all-gather", "comm", 1);
  comm::all_gather_as(s.wire, s.group, slice, full, count);
  return full;
}

float* reduce_scatter_rows(const TensorSplit& s, const float* full, float* slice,
                           const TokenRange& rows, int64_t width) {
  const int64_t count = rows.per * width;
  if (s.size() == 1) {
    if (slice != full && count > 0)
      std::memcpy(slice, full, sizeof(float) * static_cast<size_t>(count));
    return slice;
  }
  TESSERA_ASSERT(rows.ranks == s.size(), "token range of ", rows.ranks, " ranks in a group of ",
                 s.size());
  TraceSpan span("tp reduce-scatter", "comm", 1);
  comm::reduce_scatter_as(s.wire, s.group, full, slice, count);
  return slice;
}
}  // namespace

VocabRange vocab_range(const TensorSplit& s, int64_t vocab_size) {
  const int64_t t = s.size(), per = (vocab_size + t - 1) / t;
  const int64_t begin = std::min(vocab_size, s.rank() * per);
  return {begin, std::min(vocab_size, begin + per)};
}

ShardSpec vocab_shard(const TensorSplit& s, int64_t vocab_size) {
  if (s.size() == 1) return {};
  const VocabRange r = vocab_range(s, vocab_size);
  return ShardSpec{0, 1, r.begin, r.size()};
}

TokenRange token_range(const TensorSplit& s, int64_t n) {
  if (!s.sequence_parallel()) return TokenRange{0, n, n, 1, 0};
  const int t = s.size();
  const int64_t per = (n + t - 1) / t;
  const int64_t begin = std::min(n, s.rank() * per);
  return TokenRange{begin, std::min(n, begin + per), per, t, s.rank()};
}

float* copy_to_tp_backward(const TensorSplit& s, float* dx, int64_t n) {
  return sum_over_group(s, dx, n);
}

float* reduce_from_tp(const TensorSplit& s, float* x, int64_t n) {
  return sum_over_group(s, x, n);
}

const float* gather_to_tp(const TensorSplit& s, const float* slice, float* full,
                          const TokenRange& rows, int64_t width) {
  return all_gather_rows(s, slice, full, rows, width);
}

float* gather_to_tp_backward(const TensorSplit& s, const float* dfull, float* slice,
                             const TokenRange& rows, int64_t width) {
  return reduce_scatter_rows(s, dfull, slice, rows, width);
}

float* reduce_scatter_from_tp(const TensorSplit& s, const float* full, float* slice,
                              const TokenRange& rows, int64_t width) {
  return reduce_scatter_rows(s, full, slice, rows, width);
}

float* reduce_scatter_from_tp_backward(const TensorSplit& s, const float* dslice, float* dfull,
                                       const TokenRange& rows, int64_t width) {
  return all_gather_rows(s, dslice, dfull, rows, width);
}

void max_over_tp(const TensorSplit& s, float* x, int64_t n) {
  if (s.size() == 1 || n == 0) return;
  TraceSpan span("tp all-reduce max", "comm", 1);
  comm::AllReduceOptions mx;
  mx.op = comm::ReduceOp::Max;
  s.group.all_reduce(x, static_cast<size_t>(n), DType::F32, mx).wait();
}

void sum_over_tp(const TensorSplit& s, float* x, int64_t n) {
  if (s.size() == 1 || n == 0) return;
  TraceSpan span("tp all-reduce", "comm", 1);
  s.group.all_reduce(x, static_cast<size_t>(n), DType::F32).wait();
}

void mark_sequence_partial(ParameterSet& ps, int i, const TensorSplit& s) {
  TESSERA_ASSERT(ps.infos()[i].tp_replicated(), "parameter ", ps.infos()[i].name,
                 " is sharded: its gradient is not a partial sum over the sequence");
  if (!s.sequence_parallel()) return;
  GradReduction r = ps.infos()[i].reduction;
  r.over_tensor_parallel = true;
  ps.set_reduction(i, r);
}

}  // namespace tessera::nn
