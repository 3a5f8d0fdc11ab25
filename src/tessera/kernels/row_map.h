// Where the rows of a micro-batch's [B, T, C] activation (row b * T + t) lie in the step's global
// batch, for the kernels that key something by the global token: dropout masks (kernels/dropout.h,
// decision 3) and learned positions (kernels/embedding.h). Row (b, t) is global token
//   (first_sample + b) * seq_len + position(t),
// position(t) = positions[t] when the rows are a context-parallel rank's share of each sequence
// (its load-balanced chunks, nn/context_parallel.h), or t when they are the whole sequence
// (positions null, seq_len = T). The whole-sequence map gives first_sample * T + row, the
// coordinate every kernel used before context parallelism, so it draws the same numbers.
#pragma once

#include <cstdint>

namespace tessera::kernels {

struct RowMap {
  int64_t first_sample = 0;
  int64_t T = 0;        // rows per sequence here
  int64_t seq_len = 0;  // the global sequence length (0: T)
  // [T]: the global position of each local row of a sequence (null: 0, 1, ..., T - 1).
  const int64_t* positions = nullptr;

  int64_t length() const { return seq_len > 0 ? seq_len : T; }
  int64_t position(int64_t t) const { return positions != nullptr ? positions[t] : t; }
  // The global token of local row `row` (b * T + t).
  int64_t global_row(int64_t row) const {
    const int64_t b = row / T, t = row - b * T;
    return (first_sample + b) * length() + position(t);
  }
  // The whole sequences [first_sample, first_sample + ...) of T rows each.
  static RowMap whole(int64_t first_sample, int64_t T) {
    return RowMap{first_sample, T, T, nullptr};
  }
};

}  // namespace tessera::kernels
