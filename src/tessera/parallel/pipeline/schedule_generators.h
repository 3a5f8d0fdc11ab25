// Generators of the named pipeline schedules (docs/ARCHITECTURE.md, decision 18): for every
// pipeline rank, its actions in order. A compute action whose chunk borders another stage is
// preceded by the receive it needs and followed by the send the next stage needs (RecvForward F
// SendForward; RecvBackward B SendBackward; the first model stage receives no activation, the last
// no gradient), and every rank ends with ReduceGradients, OptimizerStep. Sends are assumed
// asynchronous and receives blocking; `check_deadlock` (schedule_deadlock.h) proves each generated
// list runs to the end.
#pragma once

#include <string>
#include <vector>

#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::parallel {

// GPipe (Huang et al. 2019): every micro-batch forward, then every micro-batch backward. Each
// stage holds all m micro-batches' activations at its peak.
Schedule gpipe_schedule(int pp, int micro_batches);

// 1F1B, PipeDream-Flush (Narayanan et al. 2021): rank r runs min(pp - r - 1, m) warm-up forwards,
// then alternates one forward and one backward, then runs the remaining backwards. Same bubble as
// GPipe; stage r holds at most min(pp - r, m) micro-batches.
Schedule one_f_one_b_schedule(int pp, int micro_batches);

// Interleaved 1F1B (Narayanan et al. 2021, section 2.2): each rank holds `virtual_stages` (v >= 2)
// chunks, chunk c on rank r being model stage c * pp + r. Needs pp >= 2 and m a multiple of pp.
// Bubble (pp - 1) / v of a non-interleaved one, for v times the point-to-point traffic.
Schedule interleaved_schedule(int pp, int micro_batches, int virtual_stages);

// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 2.1): 1F1B with each backward
// split into BackwardInput (BI, on the critical path between stages) and BackwardWeight (W,
// deferred into what would otherwise be the cool-down bubble). No stage holds more than pp
// micro-batches, the peak of 1F1B (on its first stage).
Schedule zb_h1_schedule(int pp, int micro_batches);

// The pipeline schedule of `kind` (not Single). Throws ConfigError for virtual_stages > 1 with a
// schedule other than interleaved, or an unmet constraint (interleaved: m a multiple of pp).
Schedule make_schedule(ScheduleKind kind, int pp, int micro_batches, int virtual_stages = 1);

}  // namespace tessera::parallel
