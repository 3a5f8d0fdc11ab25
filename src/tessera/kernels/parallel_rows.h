// Elementwise work over the rows of a matrix, spread over the calling rank's compute threads (its
// BLAS threads: train::set_compute_threads), so that a conversion beside a threaded GEMM does not
// run on one core while the GEMM's other threads wait. Pieces are disjoint ranges of whole rows, so
// for work that is elementwise the result is bitwise what one thread computes. Below
// kParallelRowsMinElements (or with one compute thread) fn runs once on the calling thread: a
// thread costs ~20-50 us to start, ~40k elements of conversion, so the smallest work that splits
// (1M elements) takes ~25x that on one thread. 512k measured no faster (docs/PERFORMANCE.md).
#pragma once

#include <cstdint>
#include <functional>

namespace tessera::kernels {

inline constexpr int64_t kParallelRowsMinElements = int64_t{1} << 20;

// The threaded case of parallel_rows (any size).
void parallel_rows_on_threads(int64_t rows, const std::function<void(int64_t, int64_t)>& fn);

// Calls fn(first_row, end_row) for pieces that cover [0, rows) once, in parallel; cols is the
// elements per row (the work's size is rows x cols). Returns when every piece is done. fn must
// not throw (a piece on another thread would end the process). Small work (every bf16 GEMM's
// conversion goes through here) is a direct call: no std::function, no thread count read.
template <class Fn>
void parallel_rows(int64_t rows, int64_t cols, Fn&& fn) {
  if (rows * cols < kParallelRowsMinElements) {
    if (rows > 0) fn(int64_t{0}, rows);
    return;
  }
  parallel_rows_on_threads(rows, fn);
}

}  // namespace tessera::kernels
