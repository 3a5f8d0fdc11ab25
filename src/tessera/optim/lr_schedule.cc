#include "tessera/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace tessera::optim {

float LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup)
    return peak * static_cast<float>(step + 1) / static_cast<float>(warmup);
  if (total <= warmup) return peak;
  double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  progress = std::clamp(progress, 0.0, 1.0);
  double cosine = 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
  return static_cast<float>(peak * (min_ratio + (1.0 - min_ratio) * cosine));
}

}  // namespace tessera::optim
