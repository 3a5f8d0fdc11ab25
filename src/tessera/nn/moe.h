// The mixture-of-experts MLP of a block (docs/ARCHITECTURE.md, decision 30): a linear fp32 router
// (moe_router.h) sends each token to its top-k of E experts, each a GPT-2 MLP
// (c_fc, gelu, c_proj); the output is sum_j kept_j gate_j expert_{e_j}(x). Parameters:
//   "h.<l>.mlp.router.weight"             [C, E]   (registered in the model's parameter set)
//   "h.<l>.mlp.experts.<e>.c_fc.weight"   [C, 4C], c_fc.bias [4C],
//   "h.<l>.mlp.experts.<e>.c_proj.weight" [4C, C], c_proj.bias [C]   (in the expert set)
// initialised like the dense MLP's (keyed by these global names, so expert e gets the same values
// wherever it lives).
//
// Expert parallelism: the experts are split over an expert-parallel group of n ranks; rank r holds
// experts [r E/n, (r + 1) E/n). Each rank routes its own tokens; the kept assignments, sorted by
// expert, are dispatched to the ranks holding their experts with all_to_allv (the per-expert
// counts exchanged first with all_to_all), every rank runs its experts on what it received
// (from all sources, expert by expert), and the outputs are combined back with the reverse
// all_to_allv. The backward does the same with the gradients. Every rank of the group must run
// the layer's forward and backward in the same order (they do: the same schedule). Without a
// group (or with one rank) the exchanges are copies. The experts are not split over tensor-
// parallel ranks: each tp rank runs the whole layer on its (replicated) input, exactly as one
// device would, so the output and the input gradient need no tensor-parallel reduction.
//
// forward/backward run over a caller-owned Record (one per micro-batch in flight); its buffers
// grow to the largest routing seen (the number of rows an expert receives varies) and are kept.
// Parameter gradients ACCUMULATE.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/core/allocator.h"
#include "tessera/core/tensor.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/parameters.h"

namespace tessera::nn {

// The expert-parallel group a layer's experts are split over (null: all experts on this rank).
struct ExpertSplit {
  comm::Communicator* group = nullptr;
  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
};

// What the layer's forwards counted since the last reset (training forwards only).
struct MoeStats {
  int layer = 0;
  double balance_sum = 0;  // sum over sequences of balance_s
  double z_sum = 0;        // sum over tokens of lse^2
  int64_t sequences = 0, tokens = 0;
  std::vector<int64_t> load;  // [E] assignments the router chose per expert (before capacity)
  int64_t assignments = 0, dropped = 0;
};

class MoeMlp {
 public:
  struct Record {
    int B = 0, T = 0;
    float loss_scale = 0;
    const float* x = nullptr;       // [N, C] the ln_2 output, kept alive by the caller
    Tensor logits, probs, lse;      // [N, E], [N, E], [N] (sized for max_batch at creation)
    std::vector<int32_t> expert;    // [N, k]
    std::vector<float> gate;        // [N, k]
    std::vector<uint8_t> kept;      // [N, k]
    std::vector<int64_t> row_of;    // [N, k] the assignment's row in the send order, or -1
    std::vector<int64_t> token_of;  // [K] the token of each send row
    std::vector<size_t> send_rows, recv_rows;  // [n] rows to / from each group rank
    std::vector<int64_t> recv_counts;  // [n, E_local] rows from source s for local expert el
    int64_t K = 0, R = 0;              // rows sent, rows received
    Tensor xe, fc, fch;                // expert side, expert-major: [R, C], [R, 4C], [R, 4C]
    Tensor out;  // [K, C] the experts' outputs for this rank's kept assignments
    Allocator* alloc = nullptr;
  };
  // Scratch shared by the MoE layers of a stage (grow-only).
  struct Workspace {
    Tensor send, recv, ye;  // [K or R, C] exchange buffers, expert outputs before the combine
    Tensor dfch;            // [R, 4C]
    Tensor dlogits;         // [N, E]
    std::vector<float> dgate;
    Allocator* alloc = nullptr;
  };

  // Registers the router in `ps` and this rank's experts in `experts`.
  MoeMlp(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg, int layer,
         ExpertSplit split);

  Record make_record(int max_batch, Allocator& alloc) const;
  static Workspace make_workspace(Allocator& alloc);

  // ASSIGNS out[B T, C] = the layer's output for x[B T, C] (x must stay unchanged until backward).
  // loss_scale weighs the auxiliary losses in backward; count_stats adds to stats().
  void forward(const float* x, float* out, int B, int T, float loss_scale, Record& r, Workspace& ws,
               bool count_stats) const;
  // Given dout[B T, C], ASSIGNS dx[B T, C] = dL/dx (through the experts and the router, including
  // the auxiliary losses) and ACCUMULATES the router's and this rank's experts' gradients.
  void backward(const Record& r, const float* dout, float* dx, Workspace& ws) const;

  int layer() const { return layer_; }
  int first_expert() const { return first_expert_; }
  int local_experts() const { return local_; }
  const MoeStats& stats() const { return stats_; }
  void reset_stats() const;

 private:
  struct ExpertParams {
    int fc_w, fc_b, proj_w, proj_b;
  };
  // Data movement of the dispatch and the combine: rows of C floats, `to` given per rank.
  void exchange(const float* send, const std::vector<size_t>& send_rows, float* recv,
                const std::vector<size_t>& recv_rows) const;
  // Rows from the receive order (source-major) to the experts' order (expert-major), or back.
  void permute_rows(const float* src, float* dst, const Record& r, bool to_experts) const;
  void plan_dispatch(Record& r) const;

  const ParameterSet& ps_;
  const ParameterSet& eps_;
  GPTConfig cfg_;
  MoeConfig m_;
  int layer_;
  ExpertSplit split_;
  int first_expert_, local_;
  int router_;
  std::vector<ExpertParams> experts_;  // local experts
  std::string dispatch_label_, combine_label_;
  mutable MoeStats stats_;
};

}  // namespace tessera::nn
