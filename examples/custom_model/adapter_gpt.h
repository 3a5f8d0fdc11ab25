// A custom model: tessera's GPT-2 modules with a user-written Adapter between the two blocks.
// Units (what data parallelism and ZeRO see, docs/API.md "Custom models"):
//   0 Embedding (wte, wpe) | 1 Block h.0 | 2 Adapter | 3 Block h.1 | 4 Head (ln_f, reads wte)
// Implementing nn::UnitModel is all it takes for parallel::DataParallel to train it at any ZeRO
// stage: units padded to the engine's alignment, buffers materialised as it asks, and the hooks
// called around every unit.
#pragma once

#include <tessera/comm.h>
#include <tessera/nn.h>

#include <memory>
#include <optional>
#include <vector>

#include "adapter.h"

class AdapterGPT final : public tessera::nn::UnitModel {
 public:
  struct Record {
    tessera::nn::Embedding::Record embedding;
    std::vector<tessera::Tensor> x;  // x[u]: the output of unit u, [B, T, C] (u = 0..3)
    tessera::nn::Block::Record h0, h1;
    Adapter::Record adapter;
    tessera::nn::Head::Record head;
  };

  AdapterGPT(const tessera::nn::GPTConfig& cfg, int max_batch, tessera::Allocator& alloc,
             const tessera::nn::FlatLayout& flat, int bottleneck = 16)
      : one_rank_(tessera::comm::one_rank()), cfg_(cfg), max_batch_(max_batch), alloc_(alloc) {
    using namespace tessera::nn;
    auto end_unit = [&] {
      ps_.pad_to_multiple(flat.unit_alignment);
      unit_begin_.push_back(ps_.numel());
    };
    unit_begin_.push_back(0);
    // The whole width on this rank: the modules' tensor- and expert-parallel groups are a group
    // of one.
    const TensorSplit whole(*one_rank_);
    embedding_.emplace(ps_, cfg, whole);
    end_unit();
    h0_.emplace(ps_, cfg, 0, whole, ExpertSplit(*one_rank_), Recompute::None);
    end_unit();
    adapter_.emplace(ps_, "adapter", cfg.n_embd, bottleneck);
    end_unit();
    h1_.emplace(ps_, cfg, 1, whole, ExpertSplit(*one_rank_), Recompute::None);
    end_unit();
    head_.emplace(ps_, cfg, embedding_->wte(), whole);
    end_unit();
    ps_.materialize(alloc, flat);
    ws_ = h0_->make_workspace(max_batch, alloc);  // shared by both blocks; ws_.dln for the head
    dres_ = tessera::Tensor::zeros({rows_max() * cfg.n_embd}, tessera::DType::F32,
                                   tessera::MemCategory::Activations, "d_residual", &alloc);
  }

  // nn::UnitModel
  tessera::nn::ParameterSet& params() override { return ps_; }
  const tessera::nn::ParameterSet& params() const override { return ps_; }
  int first_unit() const override { return 0; }
  int last_unit() const override { return 4; }
  int64_t unit_begin(int u) const override { return unit_begin_[static_cast<size_t>(u)]; }
  int tied_unit(int u) const override { return u == 4 ? 0 : -1; }  // the head reads wte
  void add_hooks(tessera::nn::UnitHooks* h) override { hooks_.add(h); }
  void remove_hooks(tessera::nn::UnitHooks* h) override { hooks_.remove(h); }

  Record make_record() const {
    Record r;
    r.embedding = embedding_->make_record(max_batch_, alloc_);
    for (int u = 0; u < 4; ++u)
      r.x.push_back(tessera::Tensor::zeros({rows_max() * cfg_.n_embd}, tessera::DType::F32,
                                           tessera::MemCategory::Activations, "x", &alloc_));
    r.h0 = h0_->make_record(max_batch_, alloc_);
    r.h1 = h1_->make_record(max_batch_, alloc_);
    r.adapter = adapter_->make_record(rows_max(), alloc_);
    r.head = head_->make_record(max_batch_, alloc_);
    return r;
  }

  // Returns the SUM of the token cross-entropies of b (scaled by ctx.loss_scale in backward).
  double forward(const tessera::nn::StepContext& ctx, const tessera::nn::Batch& b, Record& r) {
    float* x0 = r.x[0].f32();
    float* x1 = r.x[1].f32();
    float* x2 = r.x[2].f32();
    float* x3 = r.x[3].f32();
    hooks_.forward(0, [&] { embedding_->forward(ctx, b, x0, r.embedding); });
    hooks_.forward(1, [&] { h0_->forward(ctx, b, x0, x1, r.h0, ws_); });
    hooks_.forward(2, [&] { adapter_->forward(x1, x2, b.B * b.T, r.adapter); });
    hooks_.forward(3, [&] { h1_->forward(ctx, b, x2, x3, r.h1, ws_); });
    return hooks_.forward(4, [&] { return head_->forward(ctx, b, x3, r.head); });
  }

  // ACCUMULATES every parameter's gradient of the loss of the last forward into r. `pass` says
  // whether this is the step's last micro-batch (the hooks reduce the gradients then).
  void backward(Record& r, const tessera::nn::BackwardPass& pass) {
    float* d = dres_.f32();  // the residual stream's gradient, from the head down
    hooks_.backward(4, pass, [&] { head_->backward(r.head, d, ws_.dln.f32()); });
    hooks_.backward(3, pass, [&] { h1_->backward(r.h1, d, ws_); });
    hooks_.backward(2, pass, [&] { adapter_->backward(r.adapter, d); });
    hooks_.backward(1, pass, [&] { h0_->backward(r.h0, d, ws_); });
    hooks_.backward(0, pass, [&] { embedding_->backward(r.embedding, d); });
  }

 private:
  int64_t rows_max() const { return int64_t{max_batch_} * cfg_.block_size; }

  std::unique_ptr<tessera::comm::Communicator> one_rank_;
  tessera::nn::GPTConfig cfg_;
  int max_batch_;
  tessera::Allocator& alloc_;
  tessera::nn::ParameterSet ps_;
  std::vector<int64_t> unit_begin_;
  std::optional<tessera::nn::Embedding> embedding_;
  std::optional<tessera::nn::Block> h0_, h1_;
  std::optional<Adapter> adapter_;
  std::optional<tessera::nn::Head> head_;
  tessera::nn::UnitHookList hooks_;
  tessera::nn::Block::Workspace ws_;
  tessera::Tensor dres_;
};
