// The ZeRO stages (Rajbhandari et al. 2020) as a value and what each one does, in one place: the
// strategies of zero.h implement them, the planner (plan/) reads the same traits to count memory
// and traffic, and nothing switches on the stage's number.
#pragma once

#include <cstdint>

#include "tessera/core/error.h"

namespace tessera::parallel {

enum class ZeroStage : uint8_t {
  None = 0,            // plain data parallelism: every rank holds every model state
  OptimizerState = 1,  // the optimizer state sharded over the data-parallel ranks
  Gradients = 2,       // + the gradients
  Parameters = 3,      // + the parameters (gathered for each unit's forward and backward)
};

struct ZeroTraits {
  bool shards_optimizer_state = false;
  bool shards_gradients = false;
  bool shards_parameters = false;
  // Holds no full gradient between micro-batches, so every micro-batch's gradients are reduced
  // (scattered into the rank's shard) rather than only the last one's.
  bool reduces_every_micro_batch = false;
  // Units are padded so every bucket splits into equal shards (any sharding at all).
  bool sharded() const { return shards_optimizer_state; }
};

constexpr ZeroTraits traits(ZeroStage s) {
  const int n = static_cast<int>(s);
  return ZeroTraits{n >= 1, n >= 2, n >= 3, n >= 2};
}

constexpr int to_int(ZeroStage s) {
  return static_cast<int>(s);
}

// 0..3 -> the stage; otherwise a ConfigError naming the configuration key "zero".
inline ZeroStage zero_stage(int64_t stage) {
  TESSERA_CHECK_AS(ConfigError, stage >= 0 && stage <= 3, config_key("zero"),
                   " must be 0, 1, 2 or 3 (the ZeRO stage), got ", stage);
  return static_cast<ZeroStage>(stage);
}

}  // namespace tessera::parallel
