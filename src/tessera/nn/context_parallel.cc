#include "tessera/nn/context_parallel.h"

#include "tessera/core/error.h"

namespace tessera::nn {

std::vector<int64_t> context_positions(int64_t T, int n, int r) {
  TESSERA_CHECK_AS(ShapeError, n >= 1 && r >= 0 && r < n, "context-parallel rank ", r, " of ", n);
  std::vector<int64_t> pos;
  if (n == 1) {
    for (int64_t t = 0; t < T; ++t) pos.push_back(t);
    return pos;
  }
  TESSERA_CHECK_AS(ShapeError, T > 0 && T % (2 * n) == 0, "a sequence of ", T,
                   " tokens does not cut into 2 x ", n, " = ", 2 * n,
                   " equal chunks (the context-parallel ranks' load-balanced halves)");
  const int64_t c = T / (2 * n);
  pos.reserve(static_cast<size_t>(2 * c));
  for (const int64_t chunk : {int64_t{r}, int64_t{2 * n - 1 - r}})
    for (int64_t t = 0; t < c; ++t) pos.push_back(chunk * c + t);
  return pos;
}

void slice_sequences(int32_t* out, const int32_t* in, int B, int64_t T, const int64_t* positions,
                     int64_t T_local) {
  for (int b = 0; b < B; ++b)
    for (int64_t t = 0; t < T_local; ++t) out[b * T_local + t] = in[b * T + positions[t]];
}

kernels::RowMap row_map(const Batch& b) {
  return kernels::RowMap{b.first_sample, b.T, b.length(), b.positions};
}

}  // namespace tessera::nn
