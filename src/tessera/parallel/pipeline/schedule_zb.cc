// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 2.1 and figure 3).
//
// The backward of a micro-batch is split into BI (gradient with respect to the stage's input,
// which the previous stage waits for) and W (gradients of the weights, which nobody waits for).
// Forwards and BIs run in 1F1B order with 1F1B's warm-up of pp - r - 1 forwards on rank r. A
// micro-batch's activations stay until its W, and ZB-H1 allows every stage pp of them, 1F1B's
// peak (on its first stage): W of micro-batch j must run before the forward of j + pp. On rank r
// that lets W trail its BI by r micro-batches in the steady state (rank 0: BI W F BI W F ..., the
// last rank: r Ws behind). Because a BI is shorter than a whole backward, the first gradient
// reaches rank 0 earlier than under 1F1B; the Ws left over at the end run one after each
// cool-down BI and then back to back, in time that 1F1B leaves idle.
//
// Bubble (Qi et al., table 2): (pp - 1) * (T_F + T_BI - T_W) per rank, against
// (pp - 1) * (T_F + T_BI + T_W) for 1F1B. With T_F = T_BI = T_W (costs F=1, B=2, W=1) and m >= pp
// the fraction of the step that is idle is (pp - 1) / (3m + pp - 1), a third of 1F1B's bubble
// time. With m < pp the chain of forwards and BIs is longer than that and sets the step time.
#include <algorithm>

#include "tessera/parallel/pipeline/schedule_builder.h"
#include "tessera/parallel/pipeline/schedule_generators.h"

namespace tessera::parallel {

Schedule zb_h1_schedule(int pp, int micro_batches) {
  Schedule s = detail::empty_schedule(ScheduleKind::ZeroBubbleH1, pp, micro_batches, 1);
  const int m = micro_batches;
  for (int r = 0; r < pp; ++r) {
    detail::RankProgram prog(s, r);
    const int warmup = std::min(pp - r - 1, m);
    const int w_lag = r;  // BIs this rank may run ahead of its Ws in the steady state
    int next_bi = 0, next_w = 0;
    auto run_bi = [&] { prog.backward_input(next_bi++, 0); };
    auto run_w = [&] { prog.backward_weight(next_w++, 0); };
    for (int i = 0; i < warmup; ++i) prog.forward(i, 0);
    for (int i = 0; i < m - warmup; ++i) {
      prog.forward(warmup + i, 0);
      run_bi();
      if (next_bi - next_w > w_lag) run_w();
    }
    while (next_bi < m) {
      run_bi();
      run_w();
    }
    while (next_w < m) run_w();
    s.ranks[static_cast<size_t>(r)] = std::move(prog).finish();
  }
  return s;
}

}  // namespace tessera::parallel
