// Learning-rate schedule: linear warmup from 0 to `peak` over `warmup` steps, then cosine decay
// to `min_ratio * peak` at `total` steps (and constant after).
#pragma once

#include <cstdint>

namespace tessera::optim {

struct LrSchedule {
  float peak = 3e-4f;
  int64_t warmup = 0;
  int64_t total = 1;
  float min_ratio = 0.1f;
  // `step` is 0-based: the learning rate used for the update that ends step `step`.
  float at(int64_t step) const;
};

}  // namespace tessera::optim
