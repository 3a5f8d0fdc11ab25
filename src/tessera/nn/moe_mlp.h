// A mixture-of-experts MLP branch (an Mlp, nn/mlp.h; decision 30): y = x + dropout(moe(ln_2(x))),
// where moe is the router and experts of nn/moe.h (the experts' biases are inside its output, so
// the branch adds none). HF names "h.<l>.ln_2.*", "h.<l>.mlp.router.weight",
// "h.<l>.mlp.experts.<e>.*"; the router in the model's parameter set, the experts in the expert
// set.
//
// The mixture runs on every token of the micro-batch (its capacity is per sequence) and is
// complete on every tensor-parallel rank (experts are not split over tp): no reduce point. Under
// sequence parallelism ln_2's rows are all-gathered (in fp32 whatever the wire: the router reads
// fp32) into the record, which keeps every token, and each rank keeps its rows of the output for
// the residual add; the backward all-gathers the output gradient and takes this rank's rows of the
// complete input gradient. Everything is computed in backward (also under the zero-bubble split);
// under full recomputation the forward, exchanges included, reruns before the backward.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "tessera/nn/linear.h"
#include "tessera/nn/mlp.h"
#include "tessera/nn/moe.h"

namespace tessera::nn {

struct MoeMlpRecord final : MlpRecord {
  Tensor ln2;  // fp32: rows x C, or every token (padded rows) under sequence parallelism
  Tensor ln2_mean, ln2_rstd;                      // rows
  std::shared_ptr<MixtureOfExperts::Record> moe;  // the router's and experts' activations
  Tensor mask;                                    // U8 rows x C
};

class MoeMlp final : public Mlp {
 public:
  // Registers ln_2 and the router in `ps`, this rank's experts in `experts`.
  MoeMlp(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg, int layer,
         const TensorSplit& split, ExpertSplit expert_split, const ContextSplit& context,
         Recompute recompute);

  const char* kind() const override { return "moe"; }
  std::unique_ptr<MlpRecord> make_record(int max_batch, Allocator& alloc,
                                         std::vector<NamedActivation>* list) const override;
  void reserve(BlockWorkspace& ws, int max_batch, Allocator& alloc) const override;
  void forward(const BlockPass& mb, const float* x, float* y, MlpRecord& r,
               BlockWorkspace& ws) const override;
  void recompute(const BlockPass& mb, const float* x, BlockWorkspace& ws) const override;
  void backward(const BlockPass& mb, const float* x, MlpRecord& r, float* dres, BlockWorkspace& ws,
                bool defer) const override;
  void backward_weight(const BlockPass& mb, MlpRecord& r) const override;
  size_t deferred_bytes(int64_t) const override { return 0; }  // nothing is deferred
  const MixtureOfExperts* experts() const override { return &moe_; }

 private:
  void allocate(MoeMlpRecord& r, int max_batch, Allocator& alloc,
                std::vector<NamedActivation>* list) const;
  void run_forward(const BlockPass& mb, const float* x, float* y, MoeMlpRecord& r,
                   BlockWorkspace& ws) const;
  void run_backward(const BlockPass& mb, const float* x, const MoeMlpRecord& r, float* dres,
                    BlockWorkspace& ws) const;
  MoeMlpRecord& scratch(BlockWorkspace& ws) const;

  const ParameterSet& ps_;
  GPTConfig cfg_;
  int layer_;
  TensorSplit split_;
  Recompute recompute_;
  int64_t rows_per_sequence_;  // of a record (ContextSplit::rows_per_sequence)
  int ln_w_ = -1, ln_b_ = -1;
  MixtureOfExperts moe_;
  uint64_t site_drop_;
};

}  // namespace tessera::nn
