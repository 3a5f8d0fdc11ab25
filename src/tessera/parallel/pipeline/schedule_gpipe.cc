// GPipe: all forwards, then all backwards (in the order the micro-batches went forward).
#include "tessera/parallel/pipeline/schedule_builder.h"
#include "tessera/parallel/pipeline/schedule_generators.h"

namespace tessera::parallel {

Schedule gpipe_schedule(int pp, int micro_batches) {
  Schedule s = detail::empty_schedule(ScheduleKind::GPipe, pp, micro_batches, 1);
  for (int r = 0; r < pp; ++r) {
    detail::RankProgram prog(s, r);
    for (int m = 0; m < micro_batches; ++m) prog.forward(m, 0);
    for (int m = 0; m < micro_batches; ++m) prog.backward(m, 0);
    s.ranks[static_cast<size_t>(r)] = std::move(prog).finish();
  }
  return s;
}

}  // namespace tessera::parallel
