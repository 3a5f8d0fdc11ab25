// 1F1B (PipeDream-Flush). Rank r's first backward needs micro-batch 0 to go forward through the
// pp - r - 1 later stages and come back, so it fills that time with as many forwards (warm-up);
// then each backward it runs frees the activations of one micro-batch just before the next
// forward stores another (steady state), and the last warm-up-many backwards drain the pipeline
// (cool-down).
#include <algorithm>

#include "tessera/parallel/pipeline/schedule_builder.h"
#include "tessera/parallel/pipeline/schedule_generators.h"

namespace tessera::parallel {

Schedule one_f_one_b_schedule(int pp, int micro_batches) {
  Schedule s = detail::empty_schedule(ScheduleKind::OneFOneB, pp, micro_batches, 1);
  const int m = micro_batches;
  for (int r = 0; r < pp; ++r) {
    detail::RankProgram prog(s, r);
    const int warmup = std::min(pp - r - 1, m);
    for (int i = 0; i < warmup; ++i) prog.forward(i, 0);
    for (int i = 0; i < m - warmup; ++i) {
      prog.forward(warmup + i, 0);
      prog.backward(i, 0);
    }
    for (int i = m - warmup; i < m; ++i) prog.backward(i, 0);
    s.ranks[static_cast<size_t>(r)] = std::move(prog).finish();
  }
  return s;
}

}  // namespace tessera::parallel
