// Interleaved 1F1B (Narayanan et al. 2021, section 2.2). Every rank runs m * v chunk-forwards and
// as many chunk-backwards. They are taken in groups of pp micro-batches: forwards run a group
// through chunk 0, the same group through chunk 1, ..., chunk v-1, then the next group;
// backwards run a group through chunk v-1 down to chunk 0. Groups of exactly pp micro-batches
// keep every rank busy while a group travels once around the ring of ranks, which is why m must
// be a multiple of pp.
//
// Warm-up: the first backward on rank r is micro-batch 0 on its last chunk (model stage
// (v-1)*pp + r). Before it, the group has to reach the last chunk ((v-1)*pp chunk-forwards on
// rank r) and micro-batch 0 has to finish the pp - r - 1 later stages forward and come back
// through them (2 * (pp - r - 1) chunk slots), so rank r runs that many forwards first. Then one
// forward and one backward alternate, and the last warm-up-many backwards drain the pipeline.
#include <algorithm>

#include "tessera/core/error.h"
#include "tessera/parallel/pipeline/schedule_builder.h"
#include "tessera/parallel/pipeline/schedule_generators.h"

namespace tessera::parallel {
namespace {

struct Slot {
  int micro_batch;
  int chunk;
};

// The k-th chunk-forward (forward = true) or chunk-backward of every rank.
Slot slot(int k, int pp, int v, bool forward) {
  const int group = k / (pp * v);
  const int step = (k / pp) % v;
  return Slot{group * pp + k % pp, forward ? step : v - 1 - step};
}

}  // namespace

Schedule interleaved_schedule(int pp, int micro_batches, int virtual_stages) {
  const int v = virtual_stages;
  TESSERA_CHECK_AS(ConfigError, v >= 2,
                   "the interleaved schedule needs at least 2 virtual stages (model chunks) per "
                   "rank, not ",
                   v, "; with 1 it is the 1f1b schedule");
  TESSERA_CHECK_AS(ConfigError, pp >= 2,
                   "the interleaved schedule needs at least 2 pipeline ranks, not ", pp);
  TESSERA_CHECK_AS(ConfigError, micro_batches >= 1,
                   "the interleaved schedule needs at least 1 micro-batch, not ", micro_batches);
  TESSERA_CHECK_AS(ConfigError, micro_batches % pp == 0,
                   "the interleaved schedule needs the number of micro-batches to be a multiple "
                   "of the pipeline size pp=",
                   pp, ": ", micro_batches, " is not (the next multiple is ",
                   (micro_batches / pp + 1) * pp, ")");
  Schedule s = detail::empty_schedule(ScheduleKind::Interleaved, pp, micro_batches, v);
  const int total = micro_batches * v;
  for (int r = 0; r < pp; ++r) {
    detail::RankProgram prog(s, r);
    const int warmup = std::min((v - 1) * pp + 2 * (pp - r - 1), total);
    for (int k = 0; k < warmup; ++k) {
      const Slot f = slot(k, pp, v, true);
      prog.forward(f.micro_batch, f.chunk);
    }
    for (int k = 0; k < total - warmup; ++k) {
      const Slot f = slot(warmup + k, pp, v, true);
      prog.forward(f.micro_batch, f.chunk);
      const Slot b = slot(k, pp, v, false);
      prog.backward(b.micro_batch, b.chunk);
    }
    for (int k = total - warmup; k < total; ++k) {
      const Slot b = slot(k, pp, v, false);
      prog.backward(b.micro_batch, b.chunk);
    }
    s.ranks[static_cast<size_t>(r)] = std::move(prog).finish();
  }
  return s;
}

}  // namespace tessera::parallel
