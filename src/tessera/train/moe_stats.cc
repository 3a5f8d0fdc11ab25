#include "tessera/train/moe_stats.h"

#include <algorithm>

namespace tessera::train {

// Every MoE layer's statistics of the step, summed over the ranks (tensor-parallel replicas
// counted once) so that every rank holds the same numbers.
MoeStepStats moe_step_stats(const nn::GPTConfig& model, const std::vector<nn::GPT*>& chunks,
                            bool counts, comm::Communicator& world) {
  MoeStepStats out;
  const nn::MoeConfig& m = model.moe;
  if (!m.enabled()) return out;
  const int L = model.n_layer, E = m.experts, W = 5 + E;
  std::vector<double> buf(static_cast<size_t>(L) * W, 0.0);
  if (counts)
    for (const nn::GPT* c : chunks)
      for (const nn::MixtureOfExperts* layer : c->moe_layers()) {
        const nn::MoeStats& s = layer->stats();
        double* b = buf.data() + static_cast<size_t>(s.layer) * W;
        b[0] += s.balance_sum, b[1] += s.sequences, b[2] += s.z_sum, b[3] += s.tokens;
        b[4] += s.dropped;
        for (int e = 0; e < E; ++e) b[5 + e] += s.load[static_cast<size_t>(e)];
      }
  world.all_reduce(buf.data(), buf.size(), DType::F64).wait();
  double load_sum = 0, dropped = 0;
  out.mean_load.assign(static_cast<size_t>(E), 0.0);
  for (int l = 0; l < L; ++l) {
    const double* b = buf.data() + static_cast<size_t>(l) * W;
    if (!m.is_moe_layer(l) || b[1] == 0) continue;
    const double assignments = b[3] * m.top_k;
    MoeStepStats::Layer layer;
    layer.layer = l;
    layer.balance = b[0] / b[1];
    layer.z = b[2] / b[3];
    for (int e = 0; e < E; ++e) {
      layer.load.push_back(b[5 + e] / assignments);
      layer.assigned.push_back(static_cast<int64_t>(b[5 + e]));  // integers, summed exactly
    }
    layer.assignments = static_cast<int64_t>(assignments);
    out.aux_loss += m.aux_loss * layer.balance;
    out.z_loss += m.z_loss * layer.z;
    out.max_load_ratio =
        std::max(out.max_load_ratio, *std::max_element(layer.load.begin(), layer.load.end()) * E);
    for (int e = 0; e < E; ++e) out.mean_load[static_cast<size_t>(e)] += layer.load[e];
    load_sum += 1;
    dropped += b[4];
    out.assignments += assignments;
    out.layers.push_back(std::move(layer));
  }
  for (double& x : out.mean_load) x /= std::max(1.0, load_sum);
  out.dropped_fraction = out.assignments > 0 ? dropped / out.assignments : 0;
  return out;
}

}  // namespace tessera::train
