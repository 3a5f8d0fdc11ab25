// Gradient buckets for data parallelism: runs of consecutive whole units of a stage, about
// bucket_mb each, in backward order (the last unit's bucket first), so a bucket's gradients are
// final as soon as backward has passed its units.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/comm/work.h"
#include "tessera/core/tensor.h"
#include "tessera/nn/unit_model.h"

namespace tessera::parallel {

struct Bucket {
  int first_unit = 0, last_unit = 0;    // inclusive, global unit ids
  int first_param = 0, last_param = 0;  // [first, last)
  int64_t begin = 0, end = 0;           // flat range in the stage's parameter buffers
  int64_t shard = 0;                    // (end - begin) / dp under ZeRO, else 0
  int64_t shard_offset = 0;             // this rank's shard in the packed shard buffers
  // Units that read this bucket's parameters: its own, plus a unit tied to one of them (the head
  // reading the embedding's wte). The bucket is released / reduced when all of them are done.
  int users = 0;
  // While in use: ZeRO-3 gathered parameters, ZeRO-2/3 full-size gradient buffer.
  Tensor params, grads;
  Tensor params_wire;  // ZeRO-3 under a bf16 parameter gather: the bf16 bucket being gathered
  comm::Work gather;   // ZeRO-3 prefetch in flight
  bool gathering = false;
  int fwd_done = 0, bwd_done = 0;
  int64_t size() const { return end - begin; }
};

// Buckets of about bucket_mb MiB over the stage's units, in backward order, of the parameter set
// `group` (a bucket the set has no parameters in, e.g. units without experts, is left out and its
// units map to -1). With ZeRO
// (`shards` > 0: the data-parallel size) every bucket's size divides by `shards` (the model's unit
// padding guarantees it) and Bucket::shard is set.
// bucket_of_unit[u - model.first_unit()] is the bucket holding unit u.
std::vector<Bucket> make_buckets(const nn::UnitModel& model, double bucket_mb, int shards,
                                 std::vector<int>& bucket_of_unit);

}  // namespace tessera::parallel
