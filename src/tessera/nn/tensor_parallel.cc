#include "tessera/nn/tensor_parallel.h"

namespace tessera::nn {

namespace {
void sum_over_group(const TensorSplit& s, float* x, int64_t n) {
  if (s.size() == 1 || n == 0) return;
  s.group->all_reduce(x, static_cast<size_t>(n), DType::F32).wait();
}
}  // namespace

void copy_to_tp_backward(const TensorSplit& s, float* dx, int64_t n) {
  sum_over_group(s, dx, n);
}

void reduce_from_tp(const TensorSplit& s, float* x, int64_t n) {
  sum_over_group(s, x, n);
}

}  // namespace tessera::nn
