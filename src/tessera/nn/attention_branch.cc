#include "tessera/nn/attention_branch.h"

#include <cstring>
#include <utility>

#include "tessera/core/error.h"

namespace tessera::nn {

void AttentionBranch::forward(const BlockPass& mb, const float* x, float* y, AttentionRecord& r,
                              BlockWorkspace& ws) const {
  switch (recompute_) {
    case Recompute::None:
      run_forward(mb, x, y, r, ws);
      return;
    case Recompute::Selective: {  // the probabilities go to the workspace and are dropped
      AttentionRecord& scratch = *ws.attention;
      std::swap(r.att, scratch.att), std::swap(r.att_drop, scratch.att_drop);
      run_forward(mb, x, y, r, ws);
      std::swap(r.att, scratch.att), std::swap(r.att_drop, scratch.att_drop);
      return;
    }
    case Recompute::Full:  // everything goes to the workspace and is dropped
      run_forward(mb, x, y, *ws.attention, ws);
      return;
  }
}

void AttentionBranch::recompute(const BlockPass& mb, const float* x, float* y,
                                BlockWorkspace& ws) const {
  TESSERA_ASSERT(recompute_ == Recompute::Full && ws.attention,
                 "recompute() of an attention without full recomputation");
  run_forward(mb, x, y, *ws.attention, ws);
}

AttentionRecord::Deferred& AttentionBranch::deferred_for(const BlockPass& mb,
                                                         AttentionRecord& r) const {
  return nn::deferred_for(r, mb.tokens(), [&](int64_t n) { return make_deferred(n, nullptr); });
}

void AttentionBranch::backward(const BlockPass& mb, const float* x, AttentionRecord& r, float* dres,
                               BlockWorkspace& ws, bool defer) const {
  AttentionRecord::Deferred* d = defer ? &deferred_for(mb, r) : nullptr;
  switch (recompute_) {
    case Recompute::None:
      run_backward(mb, x, r, dres, ws, d);
      return;
    case Recompute::Selective: {  // the probabilities again, from the kept qkv
      AttentionRecord& scratch = *ws.attention;
      core(mb, ws.atty.f32(), scratch.att.f32(),
           scratch.att_drop.defined() ? scratch.att_drop.f32() : nullptr, r.qkv.f32());
      std::swap(r.att, scratch.att), std::swap(r.att_drop, scratch.att_drop);
      run_backward(mb, x, r, dres, ws, d);
      std::swap(r.att, scratch.att), std::swap(r.att_drop, scratch.att_drop);
      return;
    }
    case Recompute::Full: {  // the block recomputed the forward into the workspace
      const AttentionRecord& full = *ws.attention;
      run_backward(mb, x, full, dres, ws, d);
      if (d)  // W needs atty, which lives in the shared scratch (the norm: run_backward kept it)
        std::memcpy(d->atty.f32(), full.atty.f32(),
                    sizeof(float) * static_cast<size_t>(mb.tokens() * atty_width()));
      return;
    }
  }
}

}  // namespace tessera::nn
