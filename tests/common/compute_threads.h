// Sets the compute (BLAS) threads, which the threaded kernels also spread their pieces over, for a
// scope (kernels/parallel_rows.h).
#pragma once

#include <cblas.h>

namespace tessera::testing {

class ComputeThreads {
 public:
  explicit ComputeThreads(int n) : saved_(openblas_get_num_threads()) {
    openblas_set_num_threads(n);
  }
  ~ComputeThreads() { openblas_set_num_threads(saved_); }
  ComputeThreads(const ComputeThreads&) = delete;
  ComputeThreads& operator=(const ComputeThreads&) = delete;

 private:
  int saved_;
};

}  // namespace tessera::testing
