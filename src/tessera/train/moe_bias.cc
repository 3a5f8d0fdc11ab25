#include "tessera/train/moe_bias.h"

#include <cstring>

#include "tessera/core/error.h"
#include "tessera/nn/moe_experts.h"

namespace tessera::train {

MoeBias::MoeBias(const nn::GPTConfig& model, float rate) : model_(model), rate_(rate) {
  for (int l = 0; l < model.n_layer; ++l)
    if (model.moe.is_moe_layer(l)) bias_[l].assign(static_cast<size_t>(model.moe.experts), 0.0f);
}

std::vector<float> read_score_bias(const io::SafetensorsFile& file, const std::string& name,
                                   int experts) {
  TESSERA_CHECK_AS(IoError, file.shape(name) == Shape{experts}, "tensor '", name, "' in '",
                   file.path().string(), "' has shape ", shape_str(file.shape(name)),
                   " but the model's selection bias has ", experts, " experts");
  std::vector<float> b(static_cast<size_t>(experts));
  file.read_f32(name, b.data(), experts);
  return b;
}

void MoeBias::load(const io::SafetensorsFile& file) {
  for (auto& [layer, b] : bias_) {
    const std::string name = nn::moe_names(model_, layer).score_bias;
    if (file.contains(name)) b = read_score_bias(file, name, model_.moe.experts);
  }
}

bool MoeBias::active() const {
  if (rate_ > 0) return true;
  for (const auto& [layer, b] : bias_)
    for (float v : b)
      if (v != 0.0f) return true;
  return false;
}

void MoeBias::update(const MoeStepStats& stats) {
  if (rate_ <= 0) return;
  const int64_t E = model_.moe.experts;
  for (const MoeStepStats::Layer& l : stats.layers) {
    std::vector<float>& b = bias_.at(l.layer);
    // sign(mean - load_i) = sign(assignments - E load_i), in integers.
    for (int64_t e = 0; e < E; ++e) {
      const int64_t d = l.assignments - E * l.assigned[static_cast<size_t>(e)];
      if (d > 0)
        b[static_cast<size_t>(e)] += rate_;
      else if (d < 0)
        b[static_cast<size_t>(e)] -= rate_;
    }
  }
}

void MoeBias::apply(const std::vector<nn::GPT*>& models) const {
  const bool on = active();
  for (const nn::GPT* m : models)
    for (const nn::MixtureOfExperts* layer : m->moe_layers())
      layer->set_score_bias(on ? bias_.at(layer->layer()) : std::vector<float>{});
}

void MoeBias::append_to(io::NamedTensors& out) const {
  if (!active()) return;
  for (const auto& [layer, b] : bias_) {
    Tensor t = Tensor::empty({static_cast<int64_t>(b.size())}, DType::F32, MemCategory::Buffers,
                             "checkpoint.moe_bias");
    std::memcpy(t.f32(), b.data(), sizeof(float) * b.size());
    out.emplace_back(nn::moe_names(model_, layer).score_bias, std::move(t));
  }
}

void MoeBias::check_identical(comm::Communicator& world) const {
  std::vector<int32_t> lo, hi;
  for (const auto& [layer, b] : bias_)
    for (float v : b) {
      int32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      lo.push_back(bits);
    }
  if (lo.empty()) return;
  hi = lo;
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::Min;
  world.all_reduce(lo.data(), lo.size(), DType::I32, o).wait();
  o.op = comm::ReduceOp::Max;
  world.all_reduce(hi.data(), hi.size(), DType::I32, o).wait();
  TESSERA_ASSERT(lo == hi, "the MoE selection biases differ between ranks");
}

}  // namespace tessera::train
