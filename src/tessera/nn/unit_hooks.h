// Callbacks a model makes around each unit (layer) of its forward and backward, so that parallel
// engines can act at layer granularity: launch a gradient bucket's reduction as soon as its
// gradients are final (data parallelism), gather a layer's parameter shards just before it runs
// and free them after (ZeRO-3), or give a layer's gradients a temporary buffer (ZeRO-2/3).
//
// GPT's units: 0 = embeddings (wte, wpe; wte is also the tied head), 1..L = blocks, L+1 = ln_f.
// Per micro-batch the calls are, in order:
//   forward:  before_forward(0) [embed]  { before_forward(u) [block/ln_f] after_forward(u) }
//             for u = 1..L+1, [head], after_forward(0)
//   backward: before_backward(0) [head]  { before_backward(u) [...] after_backward(u) }
//             for u = L+1..1, [embedding backward], after_backward(0)
// A unit's gradients are final for the micro-batch at its after_backward.
#pragma once

namespace tessera::nn {

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_forward(int unit) { (void)unit; }
  virtual void after_forward(int unit) { (void)unit; }
  virtual void before_backward(int unit) { (void)unit; }
  virtual void after_backward(int unit) { (void)unit; }
};

}  // namespace tessera::nn
