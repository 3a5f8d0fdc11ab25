// A training step as data: for each pipeline rank, the list of actions it performs in order
// (docs/ARCHITECTURE.md, decision 18). One executor runs any schedule; a simulator times it with
// given costs, draws it and checks it for deadlock before it runs. Generators build the lists for
// each named schedule (gpipe, 1f1b, interleaved, zb-h1); data parallelism alone is the one-stage
// schedule.
//
// Model chunks: with `virtual_stages` v, pipeline rank r holds chunks c = 0..v-1, which are the
// model stages s = c * pp + r (Narayanan et al. 2021, interleaved 1F1B). Without interleaving
// v = 1 and chunk 0 is stage r. A micro-batch m flows forward through stages 0..pp*v-1 and its
// gradient flows back from the last stage to stage 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::parallel {

enum class ActionKind : uint8_t {
  Forward,         // F(m, c): forward of micro-batch m through chunk c (input already received)
  Backward,        // B(m, c): input and weight gradients of micro-batch m through chunk c
  BackwardInput,   // zero-bubble split of B: only the gradient with respect to the chunk's input
  BackwardWeight,  // ... and later the weight gradients of that micro-batch (W)
  SendForward,     // send chunk c's output activation of micro-batch m to the next stage
  RecvForward,     // receive chunk c's input activation of micro-batch m from the previous stage
  SendBackward,  // send the gradient w.r.t. chunk c's input of micro-batch m to the previous stage
  RecvBackward,  // receive the gradient w.r.t. chunk c's output of micro-batch m from the next
  ReduceGradients,  // finish the data-parallel / embedding-group gradient reductions
  OptimizerStep,    // gradient norm, clipping, update
};

struct Action {
  ActionKind kind = ActionKind::Forward;
  int micro_batch = -1;  // -1 for ReduceGradients / OptimizerStep
  int chunk = 0;         // model chunk on this rank (0 without interleaving)
  friend bool operator==(const Action&, const Action&) = default;
};

// The kinds of schedule, and what each does: the planner, the drawings and the executor read these
// traits instead of comparing names.
enum class ScheduleKind : uint8_t { Single, GPipe, OneFOneB, Interleaved, ZeroBubbleH1 };
struct ScheduleTraits {
  const char* name;      // "single", "gpipe", "1f1b", "interleaved", "zb-h1" (--schedule)
  bool pipelined;        // stages on several ranks (Single: one stage, gradient accumulation)
  bool interleaved;      // several model chunks per rank (virtual stages)
  bool splits_backward;  // BackwardInput then BackwardWeight instead of Backward (zero bubble)
};
const ScheduleTraits& traits(ScheduleKind k);
const char* to_string(ScheduleKind k);  // traits(k).name
// The pipeline schedules a user chooses from (--schedule), in this order: gpipe, 1f1b,
// interleaved, zb-h1.
const std::vector<ScheduleKind>& pipeline_schedules();
// A pipeline schedule's name -> its kind; otherwise a ConfigError naming the key "schedule" and
// the choices.
ScheduleKind parse_schedule(const std::string& name);

struct Schedule {
  ScheduleKind kind = ScheduleKind::Single;
  std::string name;                        // to_string(kind)
  int pp = 1;                              // pipeline ranks
  int micro_batches = 1;                   // per optimizer step
  int virtual_stages = 1;                  // chunks per rank (v)
  std::vector<std::vector<Action>> ranks;  // ranks[r] = rank r's actions, in order
  // The model stage of chunk c on pipeline rank r.
  int stage_of(int rank, int chunk) const { return chunk * pp + rank; }
  int num_model_stages() const { return pp * virtual_stages; }
};

// The schedule of one stage: F0 B0 F1 B1 ... ReduceGradients OptimizerStep (gradient
// accumulation; the data-parallel reduction of the last micro-batch overlaps its backward).
Schedule single_stage_schedule(int micro_batches);

std::string to_string(ActionKind k);     // "F", "B", "BI", "W", "send F", "recv F", ...
std::string to_string(const Action& a);  // "F3", "B3.1" (chunk 1), "send F3", "reduce", "step"

// Forward, Backward, BackwardInput and BackwardWeight: the actions that occupy the rank's compute.
bool is_compute(ActionKind k);
bool is_send(ActionKind k);  // SendForward, SendBackward
bool is_recv(ActionKind k);  // RecvForward, RecvBackward

// The trace-event category an executor records an action's span under, so that a timeline read
// back from `tessera train --trace` is drawn like a simulated one: "forward", "backward",
// "backward-input", "backward-weight", "comm" (sends and receives), "reduce", "optimizer".
std::string trace_category(ActionKind k);

}  // namespace tessera::parallel
