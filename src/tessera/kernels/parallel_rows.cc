#include "tessera/kernels/parallel_rows.h"

#include <cblas.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace tessera::kernels {

void parallel_rows_on_threads(int64_t rows, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t threads =
      std::clamp<int64_t>(openblas_get_num_threads(), 1, std::max<int64_t>(rows, 1));
  if (threads == 1) {
    if (rows > 0) fn(0, rows);
    return;
  }
  const int64_t piece = (rows + threads - 1) / threads;
  std::vector<std::thread> helpers;
  for (int64_t first = piece; first < rows; first += piece)
    helpers.emplace_back(fn, first, std::min(rows, first + piece));
  fn(0, std::min(rows, piece));
  for (std::thread& t : helpers) t.join();
}

}  // namespace tessera::kernels
