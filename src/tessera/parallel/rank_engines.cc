#include "tessera/parallel/rank_engines.h"

#include <cmath>

#include "tessera/core/error.h"
#include "tessera/parallel/gather.h"

namespace tessera::parallel {

RankEngines::RankEngines(const std::vector<nn::StageModel*>& chunks, const Mesh& mesh,
                         const DataParallelOptions& o, Allocator& alloc,
                         const OptimizerFactory& make_optimizer)
    : mesh_(mesh), alloc_(alloc) {
  TESSERA_ASSERT(!chunks.empty(), "a rank's engines need at least one model chunk");
  for (nn::StageModel* model : chunks) {
    // The cp ranks of a replica hold the same parameters and see other tokens: more replicas.
    HybridShards hybrid;
    if (mesh.zero_replica_group()) hybrid = {&mesh.zero_shard_group(), mesh.zero_replica_group()};
    engines_.push_back(Engine{
        std::make_unique<DataParallel>(*model, mesh.gradient_group(), o, alloc, hybrid), false});
    if (model->has_experts())
      engines_.push_back(Engine{std::make_unique<DataParallel>(
                                    model->expert_units(), mesh.expert_gradient_group(), o, alloc),
                                true});
  }
  for (Engine& e : engines_) e.engine->create_optimizer(make_optimizer);
}

std::vector<DataParallel*> RankEngines::engines() const {
  std::vector<DataParallel*> out;
  for (const Engine& e : engines_) out.push_back(e.engine.get());
  return out;
}

void RankEngines::initialize(uint64_t seed) {
  for (Engine& e : engines_) e.engine->initialize(seed);
}

void RankEngines::load_weights(const io::SafetensorsFile& file) {
  for (Engine& e : engines_) e.engine->load_weights(file);
}

void RankEngines::load_optimizer_state(const io::SafetensorsFile& file, int64_t optimizer_steps) {
  for (Engine& e : engines_) e.engine->load_optimizer_state(file);
  for (Engine& e : engines_) e.engine->optimizer().set_steps(optimizer_steps);
}

void RankEngines::begin_step() {
  for (Engine& e : engines_) e.engine->begin_step();
  for (comm::Communicator* g : mesh_.groups()) g->reset_traffic();
}

void RankEngines::end_backward() {
  for (Engine& e : engines_) {
    e.engine->end_backward();
    if (!e.experts)  // the LayerNorms under sequence parallelism (the experts have none)
      e.engine->sum_marked_gradients(mesh_.stage_group(), &nn::GradReduction::over_tensor_parallel,
                                     "sequence-parallel replicas");
  }
  for (Engine& e : engines_)
    if (!e.experts)
      e.engine->sum_marked_gradients(mesh_.embedding(), &nn::GradReduction::over_embedding_group,
                                     "embedding group");
}

double RankEngines::grad_norm() {
  double sum = 0;  // each engine's share (experts: each expert-parallel rank its own)
  for (Engine& e : engines_) sum += e.engine->grad_norm_contribution();
  return std::sqrt(all_reduce_sum(mesh_.world(), sum));
}

void RankEngines::clip(double norm, double max_norm) {
  for (Engine& e : engines_) e.engine->clip(norm, max_norm);
}

void RankEngines::step(float lr) {
  for (Engine& e : engines_) e.engine->optimizer_step(lr);
}

io::NamedTensors RankEngines::assemble_tensor_parallel(const DataParallel& e,
                                                       io::NamedTensors local) {
  comm::Communicator& tp = mesh_.tp();
  if (tp.size() == 1) return local;
  const nn::ParameterSet& ps = e.params();
  for (auto& [name, t] : local) {
    int i = ps.contains(name) ? ps.index(name) : -1;
    if (i < 0) {  // "<kind>.<param>"
      const size_t dot = name.find('.');
      TESSERA_ASSERT(dot != std::string::npos && ps.contains(name.substr(dot + 1)),
                     "no parameter for checkpoint tensor ", name);
      i = ps.index(name.substr(dot + 1));
    }
    const nn::ParamInfo& info = ps.infos()[i];
    if (info.tp_replicated()) continue;  // every tensor-parallel rank holds the same values
    TESSERA_ASSERT(t.numel() == info.local_numel(), "checkpoint tensor ", name, " has ", t.numel(),
                   " elements, the shard ", info.local_numel());
    Tensor full = Tensor::zeros(info.global_shape, DType::F32, MemCategory::Buffers,
                                "checkpoint.tp_gather", &alloc_);
    const float* src = t.f32();
    float* dst = full.f32();
    for (int64_t j = 0; j < info.local_numel(); ++j) dst[info.global_index(j)] = src[j];
    // The shards are disjoint: each element is one rank's value plus zeros (exact).
    tp.all_reduce(dst, static_cast<size_t>(full.numel()), DType::F32).wait();
    t = std::move(full);
  }
  return local;
}

RankEngines::Gathered RankEngines::gather() {
  Gathered g;
  auto append = [](io::NamedTensors& to, io::NamedTensors from) {
    for (auto& t : from) to.push_back(std::move(t));
  };
  for (Engine& e : engines_) {
    io::NamedTensors w = assemble_tensor_parallel(*e.engine, e.engine->full_weights());
    io::NamedTensors o = assemble_tensor_parallel(*e.engine, e.engine->full_optimizer_state());
    if (e.experts) {  // each expert-parallel rank holds its own experts: to its rank 0
      w = gather_named_tensors(mesh_.ep(), std::move(w));
      o = gather_named_tensors(mesh_.ep(), std::move(o));
    }
    append(g.weights, std::move(w));
    append(g.optimizer_state, std::move(o));
  }
  // Every stage's tensors to pipeline rank 0 (world rank 0 is one of them).
  g.weights = gather_named_tensors(mesh_.pp(), std::move(g.weights));
  g.optimizer_state = gather_named_tensors(mesh_.pp(), std::move(g.optimizer_state));
  return g;
}

StepTraffic RankEngines::traffic() const {
  StepTraffic t;
  for (comm::Communicator* g : {&mesh_.gradient_group(), &mesh_.expert_gradient_group(),
                                &mesh_.stage_group(), &mesh_.embedding()})
    t.data_parallel += g->traffic().total();
  if (comm::Communicator* replicas = mesh_.zero_replica_group()) {  // HSDP's two groups
    t.zero_replicas = replicas->traffic().total();
    t.data_parallel += mesh_.zero_shard_group().traffic().total() + t.zero_replicas;
  }
  t.tensor_parallel = mesh_.tp().traffic().total();
  t.pipeline = mesh_.pp().traffic().point_to_point;
  t.expert_parallel = mesh_.ep().traffic().total();
  t.context_parallel = mesh_.cp().traffic().total();
  return t;
}

}  // namespace tessera::parallel
