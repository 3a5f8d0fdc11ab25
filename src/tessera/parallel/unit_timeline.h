// Timeline spans for each unit's forward and backward, recorded into the calling thread's Tracer
// (core/trace.h): one of the model's UnitHooks. Added first, so its spans include the time other
// hooks spend waiting (a ZeRO-3 gather) before a unit can run.
#pragma once

#include <vector>

#include "tessera/core/trace.h"
#include "tessera/nn/unit_hooks.h"

namespace tessera::parallel {

class UnitTimeline final : public nn::UnitHooks {
 public:
  // Units are global ids in [0, num_units); `head_unit` is labelled as the head.
  UnitTimeline(int num_units, int head_unit);
  void before_forward(int unit) override { fwd_start_[unit] = TraceClock::now(); }
  void after_forward(int unit) override;
  void before_backward(int unit) override { bwd_start_[unit] = TraceClock::now(); }
  void after_backward(int unit, const nn::BackwardPass& pass) override;
  void after_backward_input(int unit) override;
  void before_backward_weight(int unit) override { bwd_start_[unit] = TraceClock::now(); }

 private:
  std::string label(int unit) const;
  int head_unit_;
  std::vector<TraceClock::time_point> fwd_start_, bwd_start_;
};

}  // namespace tessera::parallel
