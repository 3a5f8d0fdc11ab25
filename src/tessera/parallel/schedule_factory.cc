// make_schedule: a named schedule, with the errors a user who picked the flags should see.
#include <algorithm>

#include "tessera/core/error.h"
#include "tessera/parallel/schedule_generators.h"

namespace tessera::parallel {

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved", "zb-h1"};
  return names;
}

Schedule make_schedule(const std::string& name, int pp, int micro_batches, int virtual_stages) {
  TESSERA_CHECK_AS(ConfigError, virtual_stages >= 1,
                   "virtual stages (model chunks per rank) must be at least 1, not ",
                   virtual_stages);
  if (name == "interleaved") return interleaved_schedule(pp, micro_batches, virtual_stages);
  const auto& names = schedule_names();
  TESSERA_CHECK_AS(ConfigError, std::find(names.begin(), names.end(), name) != names.end(),
                   "unknown pipeline schedule '", name,
                   "': choose gpipe, 1f1b, interleaved or zb-h1");
  TESSERA_CHECK_AS(ConfigError, virtual_stages == 1, "the ", name,
                   " schedule runs one model chunk per rank; ", virtual_stages,
                   " virtual stages need the interleaved schedule");
  if (name == "gpipe") return gpipe_schedule(pp, micro_batches);
  if (name == "1f1b") return one_f_one_b_schedule(pp, micro_batches);
  return zb_h1_schedule(pp, micro_batches);
}

}  // namespace tessera::parallel
