// Callbacks a model makes around each unit (layer) of its forward and backward, so that parallel
// engines can act at layer granularity: launch a gradient bucket's reduction as soon as its
// gradients are final (data parallelism), gather a layer's parameter shards just before it runs
// and free them after (ZeRO-3), or give a layer's gradients a temporary buffer (ZeRO-2/3).
//
// GPT's units: 0 = embedding (wte, wpe), 1..L = blocks, L+1 = head (ln_f; wte is tied to unit 0 and
// read from there when the embedding is on the same rank, see GPT::tied_unit). A pipeline stage
// holds a contiguous range of them. Per micro-batch, for each unit u of the stage:
//   forward:  before_forward(u) [u's forward] after_forward(u)     for u ascending
//   backward: before_backward(u) [u's backward] after_backward(u, pass)  for u descending
// A unit's gradients are final for the micro-batch at its after_backward (for the embedding's
// tied wte: at after_backward(0), which comes after the head's). With several hooks, the model
// calls before_* in the order they were added and after_* in reverse order.
#pragma once

namespace tessera::nn {

// Which micro-batch of the optimizer step a backward pass belongs to. A unit's gradients are final
// for the step at the last micro-batch's after_backward: a data-parallel engine launches their
// reduction then (ZeRO-2/3, which keep no full gradient between micro-batches, in every one). The
// caller that runs the step passes it with the backward; nothing keeps it in between.
struct BackwardPass {
  bool last_micro_batch = true;
};

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_forward(int unit) { (void)unit; }
  virtual void after_forward(int unit) { (void)unit; }
  virtual void before_backward(int unit) { (void)unit; }
  virtual void after_backward(int unit, const BackwardPass& pass) { (void)unit, (void)pass; }
  // Zero-bubble split backward: a micro-batch's backward is a BI pass, before_backward(u) [input
  // gradient and the cheap parameter gradients] after_backward_input(u), and later a W pass,
  // before_backward_weight(u) [the matmuls' weight gradients] after_backward(u, pass). A unit's
  // gradients are final at the W pass's after_backward.
  virtual void after_backward_input(int unit) { (void)unit; }
  virtual void before_backward_weight(int unit) { (void)unit; }
};

}  // namespace tessera::nn
