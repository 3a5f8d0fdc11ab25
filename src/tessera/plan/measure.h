// What one rank of a model stage allocates, measured rather than mirrored: the stage is built as
// the trainer builds it (nn::GPT with the engine's layout, tensor-, expert- and context-parallel
// groups of the layout's sizes) against an allocator of address space only (core/allocator.h) and
// placeholder groups (comm/launch.h), and its parameters, records, workspace and zero-bubble
// copies are read off. So the tessera engine's memory prediction follows the code by construction:
// a module that keeps one more tensor is planned with it.
//
// What depends on the data is not measured: a mixture of experts' routed rows (their buffers grow
// to the largest routing seen) are modelled by the engine (engine_tessera.cc). Nor what exists
// only during a call: a context-parallel attention's buffers (plan/context_parallel.h).
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/parallel/pipeline/pipeline_split.h"
#include "tessera/plan/engine.h"
#include "tessera/plan/layout.h"
#include "tessera/plan/model_spec.h"

namespace tessera::plan {

struct StageMeasure {
  // Parameter elements of each unit of the stage in the model's set and in the experts' set, and
  // their sums, padded as the data-parallel engine of `layout` pads them (pad_units).
  std::vector<double> unit_dense, unit_experts, unit_elems;
  double dense_elems = 0, expert_elems = 0;
  double tied_wte_elems = 0;          // summed over the embedding group (a wte copy, pp > 1)
  double sequence_partial_elems = 0;  // summed over the stage's ranks (--sp)
  double bf16_copy_bytes = 0;         // bf16 copies of the GEMM weights
  // Bytes of one micro-batch's record, of the stage's scratch (the blocks' workspace and the
  // residual gradient), and of what a zero-bubble BI keeps for W (a micro-batch of
  // micro_batch x seq / cp tokens).
  double record_bytes = 0, workspace_bytes = 0, deferred_bytes = 0;
  int moe_blocks = 0;  // MoE blocks (or MLP halves) of the stage
};

// The stage of `units` under layout `l`. What the data-parallel engine changes (ZeRO's padding of
// every unit to 16 x the group's size, ZeRO-3's lack of resident weights to copy) is applied to a
// measurement without it (pad_units), so one measurement serves every dp and ZeRO stage.
// `backing`: Backing::Memory builds the stage in real memory (the tests compare the two).
StageMeasure measure_stage(const ModelSpec& m, const Layout& l, const parallel::UnitRange& units,
                           const EngineOptions& o, Backing backing = Backing::AddressSpaceOnly);
// A measurement made with 16-float units, as the data-parallel engine of `l` lays them out.
StageMeasure pad_units(StageMeasure s, const Layout& l);

}  // namespace tessera::plan
