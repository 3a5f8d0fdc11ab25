#include "tessera/parallel/unit_timeline.h"

#include <string>

namespace tessera::parallel {

UnitTimeline::UnitTimeline(int num_units, int head_unit)
    : head_unit_(head_unit), fwd_start_(num_units), bwd_start_(num_units) {}

std::string UnitTimeline::label(int unit) const {
  if (unit == 0) return "embedding";
  if (unit == head_unit_) return "head";
  return "block " + std::to_string(unit - 1);
}

void UnitTimeline::after_forward(int unit) {
  if (Tracer* t = Tracer::current())
    t->record("forward " + label(unit), "forward", 0, fwd_start_[unit], TraceClock::now());
}

void UnitTimeline::after_backward(int unit, const nn::BackwardPass&) {
  if (Tracer* t = Tracer::current())
    t->record("backward " + label(unit), "backward", 0, bwd_start_[unit], TraceClock::now());
}

void UnitTimeline::after_backward_input(int unit) {
  if (Tracer* t = Tracer::current())
    t->record("backward-input " + label(unit), "backward-input", 0, bwd_start_[unit],
              TraceClock::now());
}

}  // namespace tessera::parallel
