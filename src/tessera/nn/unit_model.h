// A model as the parallel engines see it (docs/API.md, "Custom models"): a contiguous range of
// *units* (layers) [first_unit(), last_unit()] over one ParameterSet, where unit u's parameters
// are the flat range [unit_begin(u), unit_begin(u + 1)) and the model calls its UnitHooks around
// each unit's forward and backward in the order unit_hooks.h gives. GPT is one; a model written
// by a library user from tessera's modules and its own layers is another, and then trains under
// DataParallel and every ZeRO stage unchanged.
//
// What an implementation promises:
//   * units are registered in order, each padded with ParameterSet::pad_to_multiple(alignment)
//     (FlatLayout::unit_alignment, parameters.h) before the next begins, so
//     unit_begin(first_unit()) == 0 and unit_begin(last_unit() + 1) == params().numel();
//   * the ParameterSet is materialised with that FlatLayout (ParameterSet::materialize);
//   * every kernel reads parameters and gradients through params().param_data(i) / grad_data(i)
//     at use time (ZeRO-3 points them at gathered buffers only while the unit runs), and
//     parameter gradients ACCUMULATE;
//   * forward calls before_forward(u) / after_forward(u) for u ascending, backward
//     before_backward(u) / after_backward(u, pass) for u descending, passing on which micro-batch
//     of the step the backward is (UnitHookList does the ordering).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "tessera/nn/parameters.h"
#include "tessera/nn/unit_hooks.h"

namespace tessera::nn {

class UnitModel {
 public:
  virtual ~UnitModel() = default;

  virtual ParameterSet& params() = 0;
  virtual const ParameterSet& params() const = 0;
  // Global unit ids of the units this rank holds (a pipeline stage holds a sub-range).
  virtual int first_unit() const = 0;
  virtual int last_unit() const = 0;
  // Flat offset where unit u's parameters start, u in [first_unit(), last_unit() + 1].
  virtual int64_t unit_begin(int u) const = 0;
  // The other unit whose parameters unit u also reads (a head tied to the embedding), or -1.
  virtual int tied_unit(int u) const {
    (void)u;
    return -1;
  }
  // false for one stage of a model split into pipeline stages: a full-model weights file then
  // holds tensors this rank does not read.
  virtual bool holds_whole_model() const { return true; }

  // Engines (DataParallel, UnitTimeline) register here; the model calls them around every unit.
  virtual void add_hooks(UnitHooks* hooks) = 0;
  virtual void remove_hooks(UnitHooks* hooks) = 0;
};

// The hooks of one model, called in the order unit_hooks.h specifies: before_* in the order they
// were added, after_* in reverse (nested scopes). A model keeps one and wraps each unit's pass:
//   hooks_.forward(u, [&] { layer.forward(...); });
class UnitHookList {
 public:
  void add(UnitHooks* h) { hooks_.push_back(h); }
  void remove(UnitHooks* h) { std::erase(hooks_, h); }

  // before_forward(u), fn(), after_forward(u); returns fn's result.
  template <typename Fn>
  decltype(auto) forward(int u, Fn&& fn) {
    return scoped(&UnitHooks::before_forward, &UnitHooks::after_forward, u, fn);
  }
  // before_backward(u), fn(), after_backward(u, pass).
  template <typename Fn>
  void backward(int u, const BackwardPass& pass, Fn&& fn) {
    call(&UnitHooks::before_backward, u);
    fn();
    after_backward(u, pass);
  }
  // The single calls, for models that split a pass (zero-bubble backward_input / weight).
  void call(void (UnitHooks::*f)(int), int u) const {
    for (UnitHooks* h : hooks_) (h->*f)(u);
  }
  void call_reverse(void (UnitHooks::*f)(int), int u) const {
    for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) ((*it)->*f)(u);
  }
  void after_backward(int u, const BackwardPass& pass) const {
    for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) (*it)->after_backward(u, pass);
  }

 private:
  template <typename Fn>
  decltype(auto) scoped(void (UnitHooks::*before)(int), void (UnitHooks::*after)(int), int u,
                        Fn& fn) {
    call(before, u);
    if constexpr (std::is_void_v<decltype(fn())>) {
      fn();
      call_reverse(after, u);
    } else {
      decltype(auto) r = fn();
      call_reverse(after, u);
      return r;
    }
  }
  std::vector<UnitHooks*> hooks_;
};

}  // namespace tessera::nn
