// The mixture of experts inside an MoE block's MLP branch (nn/moe_mlp.h, nn/swiglu_moe_mlp.h;
// docs/ARCHITECTURE.md, decision 30), on its input x = the norm's output of every token: a linear
// fp32 router (moe_router.h: softmax or sigmoid scores, an optional selection bias) sends each
// token to its top-k of E experts (moe_experts.h: GPT-2 MLPs, or the Llama family's SwiGLU MLPs);
// the output is sum_j kept_j gate_j expert_{e_j}(x). Parameters (moe_experts.h's MoeNames):
//   the router, "h.<l>.mlp.router.weight" [C, E] (GPT-2's Conv1D layout) or
//     "model.layers.<l>.{block_sparse_moe,mlp}.gate.weight" [E, C] (nn.Linear layout), in the
//     model's parameter set;
//   this rank's experts in the expert set ("h.<l>.mlp.experts.<e>.c_fc.weight", ...),
// initialised like the dense MLP's (keyed by these global names, so expert e gets the same values
// wherever it lives).
//
// Expert parallelism: the experts are split over an expert-parallel group of n ranks; rank r holds
// experts [r E/n, (r + 1) E/n). Each rank routes its own tokens and orders its kept assignments
// (the "row order") by the rank holding their expert -- the other ranks in rank order first, its
// own last -- then by expert, token and choice. The rows for the other ranks are dispatched with
// all_to_allv (the per-expert counts exchanged first with all_to_all); the rows for its own
// experts never leave it. Every rank runs its experts block by block, one block per (local expert,
// source rank), and sends the outputs of the other ranks' rows back with the reverse all_to_allv
// (the combine). The backward does the same with the gradients.
//
// Overlap: every exchange is asynchronous (the group's progress thread), and a rank fills each
// wait with work that does not depend on it: its own rows while the dispatch travels; the other
// ranks' rows first as soon as they have arrived (another rank waits for them), then its own;
// and in backward the experts' weight gradients while the combine travels. So a rank whose
// experts drew fewer tokens in one layer runs ahead instead of waiting for the busier rank at the
// combine. Results do not depend on the timing: each block's GEMMs are the same whatever the
// order, and each expert's weight gradient accumulates its blocks in a fixed order (this rank's
// own rows, then the other ranks' in rank order).
//
// Every rank of the group must run the layer's forward and backward in the same order (they do:
// the same schedule). Without a group (or with one rank) there is no exchange. The experts are not
// split over tensor-parallel ranks: each tp rank runs the whole layer on its (replicated) input,
// exactly as one device would, so the output and the input gradient need no tensor-parallel
// reduction.
//
// Context parallelism (nn/context_parallel.h): a micro-batch's sequences are split over the layer's
// context-parallel group, and what a sequence decides as a whole -- which assignments fit in an
// expert's per-sequence capacity (filled in position order), and the balance loss's f_si -- needs
// every rank's choices: the ranks all-gather their rows' positions and choices (k int32 per token,
// over the cp group) and each computes the whole sequence's capacity and counts, keeping its own
// rows' share. The balance loss's P_si and the z-loss are sums over tokens, which the ranks split;
// the statistics count a sequence once (on cp rank 0) and every rank's tokens.
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
#include "tessera/nn/context_parallel.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/moe_exchange.h"
#include "tessera/nn/moe_experts.h"
#include "tessera/nn/parameters.h"

namespace tessera::nn {

struct Linear;  // nn/linear.h

// The expert-parallel group a layer's experts are split over. Always a group: one rank (a size-1
// communicator) holds every expert and exchanges nothing.
struct ExpertSplit {
  explicit ExpertSplit(comm::Communicator& g) : group(g) {}
  comm::Communicator& group;
  int size() const { return group.size(); }
  int rank() const { return group.rank(); }
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

class MixtureOfExperts {
 public:
  // The rows of one side of an expert's work: this rank's own assignments to its own experts
  // (local), or the rows received from the other ranks (remote).
  struct ExpertRows {
    Tensor in, act, hid;  // [rows, C] and the experts' two kept activations (moe_experts.h)
  };
  struct Record {
    int B = 0, T = 0;
    int seq_len = 0;  // the whole sequence's length (T, or T x the cp ranks when split)
    float loss_scale = 0;
    const float* x = nullptr;          // [N, C] the ln_2 output, kept alive by the caller
    Tensor logits, probs, lse;         // [N, E], [N, E], [N] (sized for max_batch at creation)
    Tensor scores;                     // [N, E] a sigmoid router's scores (probs: normalised)
    std::vector<int32_t> expert;       // [N, k]
    std::vector<float> gate;           // [N, k]
    std::vector<uint8_t> kept;         // [N, k]
    std::vector<double> seq_counts;    // [B, E] the whole sequences' choices (split only)
    std::vector<int64_t> row_of;       // [N, k] the assignment's place in the row order, or -1
    std::vector<int64_t> token_of;     // [K] the token of each row
    std::vector<int64_t> send_counts;  // [E] rows this rank sends to each expert
    std::vector<int64_t> counts;       // [n, E_local] rows from source s for local expert el
    std::vector<size_t> send_rows, recv_rows;  // [n] rows to / from each other rank (own: 0)
    int64_t K = 0, K_remote = 0;  // rows in the row order; the first K_remote go to other ranks
    int64_t R = 0;                // rows received from the other ranks
    ExpertRows local, remote;     // remote: received, source-major, then by local expert
    Tensor out;                   // [K, C] the experts' outputs in the row order
    Allocator* alloc = nullptr;
  };
  // Scratch shared by the MoE layers of a stage (grow-only).
  struct Workspace {
    Tensor send;       // [K, C] the rows' output gradients in the row order (forward: the inputs of
                       // the first K_remote rows, those dispatched)
    Tensor ye;         // [R, C] the remote rows' outputs, then their input gradients
    Tensor dy_remote;  // [R, C] the remote rows' output gradients
    Tensor dfc_local, dfc_remote;  // [K - K_remote, act], [R, act]: d act of the rows
    Tensor dhid;                   // [rows of a block, the experts' scratch width]
    Tensor dx_rows;                // [K, C] the input gradient of every row, in the row order
    Tensor dlogits;                // [N, E]
    std::vector<float> dgate;
    // The shared expert's scratch (nn/swiglu_moe_mlp.h): every token's output gradient of it and
    // its hidden width's gradient.
    Tensor shared_d, shared_dh;
    Allocator* alloc = nullptr;
  };

  // Registers the router in `ps` and this rank's experts in `experts`. `context`: the group a
  // split micro-batch's sequences are split over (see above).
  MixtureOfExperts(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg, int layer,
                   ExpertSplit split, ContextSplit context);
  // Whole sequences only (its own group of one for the context).
  MixtureOfExperts(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg, int layer,
                   ExpertSplit split);

  Record make_record(int max_batch, Allocator& alloc) const;
  static Workspace make_workspace(Allocator& alloc);

  // ASSIGNS out[B T, C] = the layer's output for x[B T, C] (x must stay unchanged until backward).
  // loss_scale weighs the auxiliary losses in backward; count_stats adds to stats(). positions
  // (non-null): the T rows of each sequence are this rank's share, at these global positions, of
  // sequences split over the context-parallel group (collective over it).
  void forward(const float* x, float* out, int B, int T, float loss_scale, Record& r, Workspace& ws,
               bool count_stats, const int64_t* positions = nullptr) const;
  // Given dout[B T, C], ASSIGNS dx[B T, C] = dL/dx (through the experts and the router, including
  // the auxiliary losses) and ACCUMULATES the router's and this rank's experts' gradients.
  void backward(const Record& r, const float* dout, float* dx, Workspace& ws) const;

  int layer() const { return layer_; }
  int first_expert() const { return first_expert_; }
  int local_experts() const { return local_; }
  const MoeStats& stats() const { return stats_; }
  void reset_stats() const;
  const MoeNames& names() const { return names_; }

  // The selection bias of auxiliary-loss-free balancing ([E], added to the scores to choose the
  // top k, never to the gates), or none (empty: the scores alone). It is state of the trainer, not
  // a parameter: the same on every rank, set between steps (train/moe_bias.h), hence const.
  void set_score_bias(std::vector<float> bias) const;
  const std::vector<float>& score_bias() const { return score_bias_; }

 private:
  // Rows [begin, begin + rows) of one side for local expert el.
  struct RowBlock {
    int el;
    int64_t begin, rows;
  };
  // Orders the kept assignments (row order), counts the rows for each rank and posts the exchange
  // of the per-expert counts (nothing to post on one rank).
  PendingExchange plan_rows(Record& r) const;
  // Once the counts have arrived: the rows this rank receives, per source and local expert.
  void plan_receive(Record& r) const;
  std::vector<RowBlock> local_blocks(const Record& r) const;
  std::vector<RowBlock> remote_blocks(const Record& r) const;
  // The local work in pieces, so that the other ranks' rows wait at most one piece once they have
  // arrived (fixed by the counts alone, so the results do not depend on the timing). One rank:
  // the blocks as they are.
  std::vector<RowBlock> pieces(const std::vector<RowBlock>& blocks) const;
  // An expert's forward on one block, its input side of the backward (dact and dx ASSIGNED), and
  // its weight gradients (ACCUMULATED): ExpertMlps on the block's rows of one side.
  void block_forward(const RowBlock& b, ExpertRows& side, float* out) const;
  void block_backward_data(const RowBlock& b, const ExpertRows& side, const float* dy, float* dact,
                           float* dx, Workspace& ws) const;
  void block_backward_weights(const RowBlock& b, const ExpertRows& side, const float* dy,
                              const float* dact) const;
  MixtureOfExperts(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg, int layer,
                   ExpertSplit split, comm::Communicator* context,
                   std::unique_ptr<comm::Communicator> own_context);
  // The router as a linear layer (moe.cc; nn/linear.h).
  Linear router() const;
  // A split micro-batch: every cp rank's rows' choices gathered into the whole sequences', the
  // capacity decided on them (r.kept: this rank's rows) and r.seq_counts; returns the dropped
  // assignments of this rank's rows.
  int64_t route_whole_sequences(Record& r, const int64_t* positions) const;

  const ParameterSet& ps_;
  const ParameterSet& eps_;
  GPTConfig cfg_;
  MoeConfig m_;
  int layer_;
  ExpertSplit split_;
  std::unique_ptr<comm::Communicator> own_context_;  // the group of one of a layer built alone
  ContextSplit context_;
  int first_expert_, local_;
  MoeNames names_;
  int router_ = -1;  // [C, E] (GPT-2) or, for the Llama family, [E, C] (nn.Linear layout)
  std::unique_ptr<ExpertMlps> experts_;  // local experts
  std::string dispatch_label_, combine_label_;
  mutable MoeStats stats_;
  mutable std::vector<float> score_bias_;
};

}  // namespace tessera::nn
