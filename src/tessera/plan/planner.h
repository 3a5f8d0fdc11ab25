// `tessera plan`: what a layout of a training job will cost before it is launched. For one layout:
// memory per device by term (parameters, gradients, optimizer state, activations of the
// micro-batches the schedule keeps in flight, communication buffers) on every pipeline rank, and
// the step time (compute, exposed tensor-parallel, context-parallel, pipeline and data-parallel
// communication, the bubble), tokens/s and MFU. Without a layout: every layout of the device
// count, ranked (docs/PLANNER.md).
//
// The step: each model stage's forward, backward and weight-gradient times per micro-batch (its
// matmul FLOPs at the cluster's achievable rate, its elementwise traffic at the memory bandwidth,
// its tensor-parallel and expert-parallel collectives, which run in line, and what its
// context-parallel exchanges do not hide behind the attention: plan/context_parallel.h) and the
// transfer time between stages are given to the schedule simulator (parallel/schedule_simulate.h),
// which plays the schedule; each rank then adds what follows its last backward: the data-parallel
// (dp x cp) reduction that did not overlap, the optimizer step and ZeRO's parameter gathers.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tessera/plan/cluster.h"
#include "tessera/plan/cross_node.h"
#include "tessera/plan/engine.h"
#include "tessera/plan/layout.h"
#include "tessera/plan/model_spec.h"

namespace tessera::plan {

struct PlanRequest {
  ModelSpec model;
  ClusterSpec cluster;
  int global_batch = 16;             // sequences per optimizer step
  std::string engine;                // "" = the cluster's
  std::string precision;             // "" = the cluster's; selects peak_tflops
  std::optional<double> dp_overlap;  // unset = the cluster's
  EngineOptions engine_options;
  // Allow more ranks than devices (CPU ranks sharing cores): each device then runs
  // ceil(ranks / devices) ranks, their compute time-shared and their memory divided.
  bool oversubscribe = false;
};

// Where one pipeline rank's step goes (seconds).
struct RankTime {
  double compute = 0;  // forward, backward, recomputation (incl. in-line tp/ep comm)
  double tp_comm = 0;  // of which tensor-parallel collectives
  double ep_comm = 0;  // of which expert-parallel all-to-alls
  // Context parallelism's exchanges (keys and values, MoE routing) of the step, and the part of
  // them in `compute`: what the attention core does not hide (ring) or all of it (allgather,
  // ulysses).
  double cp_comm = 0, cp_exposed = 0;
  double end_of_backward = 0;  // in the simulated step
  double dp_comm = 0;          // data-parallel communication of the step
  double dp_exposed = 0;       // the part that does not overlap the backward
  double optimizer = 0;
};

struct Prediction {
  Layout layout;
  std::vector<std::string> problems;  // why the layout cannot run at all (empty: it can)
  bool fits = false;
  std::string why_not;  // when it does not fit: the rank, the total and the terms by size
  // Memory per device of every pipeline rank; `memory` is the largest.
  std::vector<MemoryTerms> rank_memory;
  MemoryTerms memory;
  int memory_rank = 0;
  double capacity = 0;  // bytes per device
  // In flight: per pipeline rank, micro-batches at the peak (through all of its layers).
  std::vector<double> in_flight;
  // Time.
  bool simulated = false;  // from the schedule simulator (else the closed-form estimate)
  int micro_batches = 0;
  double step_seconds = 0;
  double bubble = 0;       // idle share of the simulated step's compute phase (all ranks)
  double p2p_seconds = 0;  // one transfer between stages
  std::vector<RankTime> rank_time;
  int critical_rank = 0;  // the pipeline rank whose end sets the step
  double tokens_per_second = 0;
  double model_flops_per_step = 0;     // 6 N + 12 L C T per token
  double hardware_flops_per_step = 0;  // what runs, recomputation included
  double mfu = 0, hfu = 0;             // of the devices' peak
  double tflops_per_device = 0;        // hardware FLOP/s per device
  // Bytes one rank sends per step (ring accounting): data-parallel (as TrainResult's
  // comm_bytes_per_step counts them, pipeline rank 0), tensor-parallel, point to point, to its
  // context-parallel ranks (TrainResult's cp_bytes_per_step) and to its expert-parallel ranks
  // (the all-to-alls' rows for other ranks under balanced routing: ep_bytes_per_step).
  double dp_bytes = 0, tp_bytes = 0, p2p_bytes = 0, cp_bytes = 0, ep_bytes = 0;
  // Bytes between nodes per step, all nodes summed, each byte once, as the hierarchical backend
  // sends them with one process per node (plan/cross_node.h); all zero inside one node.
  CrossNodeBytes across;
  int nodes_spanned = 1;  // nodes the layout's ranks occupy
  bool ok() const { return problems.empty(); }
};

// One layout. ConfigError when the request itself is unusable (model, batch, devices).
Prediction plan_layout(const PlanRequest& r, const Layout& l);

// Which layouts a ranking considers: a set field is held fixed, an unset one enumerated. Context
// parallelism is enumerated only up to max_cp (1: none, so a ranking without --cp or --max-cp is
// what it was before cp existed): every cp dividing the devices up to it, each with every
// cp_comm unless that is set.
struct LayoutSpace {
  std::optional<int> dp, tp, pp, ep, cp, virtual_stages, micro_batch;
  std::optional<nn::CpComm> cp_comm;
  int max_cp = 1;
  std::optional<parallel::ZeroStage> zero;
  std::optional<int> zero_shard;  // HSDP's shard group (Layout::zero_shard) for every layout
  std::optional<bool> sp;
  std::optional<parallel::ScheduleKind> schedule;
  std::optional<nn::Recompute> recompute;
  std::vector<int> micro_batch_sizes = {1, 2, 4, 8};
  int max_virtual_stages = 4;
  bool tp_within_node = true;  // tensor parallelism inside a node only (the seed's advice)
};

struct Ranking {
  int devices = 0;
  int considered = 0;                   // layouts of the device count that can run
  int skipped = 0;                      // combinations that cannot run (layout_problems)
  std::vector<Prediction> fitting;      // by step time, fastest first
  std::vector<Prediction> not_fitting;  // smallest need first
  int simulated = 0;                    // how many of `fitting` were simulated
};

// Every layout of `devices` devices in `space`. Memory is computed exactly for all of them; the
// ones that fit are timed with the closed-form bubble, then the `simulate_top` fastest with the
// schedule simulator and re-ranked.
Ranking rank_layouts(const PlanRequest& r, int devices, const LayoutSpace& space,
                     int simulate_top = 32);

}  // namespace tessera::plan
