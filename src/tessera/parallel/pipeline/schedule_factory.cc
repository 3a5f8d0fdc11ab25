// make_schedule: a pipeline schedule by kind, with the errors a user who picked the flags should
// see.
#include "tessera/core/error.h"
#include "tessera/parallel/pipeline/schedule_generators.h"

namespace tessera::parallel {

Schedule make_schedule(ScheduleKind kind, int pp, int micro_batches, int virtual_stages) {
  TESSERA_CHECK_AS(ConfigError, virtual_stages >= 1, config_key("virtual_stages"),
                   " (model chunks per rank) must be at least 1, not ", virtual_stages);
  TESSERA_CHECK_AS(ConfigError, traits(kind).pipelined, "the ", to_string(kind),
                   " schedule is not a pipeline schedule");
  if (traits(kind).interleaved) return interleaved_schedule(pp, micro_batches, virtual_stages);
  TESSERA_CHECK_AS(ConfigError, virtual_stages == 1, "the ", to_string(kind),
                   " schedule runs one model chunk per rank; ", virtual_stages, " ",
                   config_key("virtual_stages"), " need the interleaved schedule");
  switch (kind) {
    case ScheduleKind::GPipe:
      return gpipe_schedule(pp, micro_batches);
    case ScheduleKind::OneFOneB:
      return one_f_one_b_schedule(pp, micro_batches);
    default:
      return zb_h1_schedule(pp, micro_batches);
  }
}

}  // namespace tessera::parallel
