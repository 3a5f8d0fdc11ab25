#include "tessera/nn/tensor_parallel.h"

#include <algorithm>

namespace tessera::nn {

namespace {
void sum_over_group(const TensorSplit& s, float* x, int64_t n) {
  if (s.size() == 1 || n == 0) return;
  s.group->all_reduce(x, static_cast<size_t>(n), DType::F32).wait();
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

void copy_to_tp_backward(const TensorSplit& s, float* dx, int64_t n) {
  sum_over_group(s, dx, n);
}

void reduce_from_tp(const TensorSplit& s, float* x, int64_t n) {
  sum_over_group(s, x, n);
}

}  // namespace tessera::nn
