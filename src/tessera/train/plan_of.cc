#include "tessera/train/plan_of.h"

#include <nlohmann/json.hpp>

#include "tessera/io/atomic_file.h"
#include "tessera/io/json_parse.h"
#include "tessera/kernels/precision.h"
#include "tessera/nn/gpt_config.h"

namespace tessera::plan {

ModelSpec model_of(const train::TrainConfig& c) {
  ModelSpec m;
  m.layers = c.layers;
  m.hidden = c.dim;
  m.heads = c.new_model_heads();
  m.seq = c.seq;
  m.vocab = c.vocab;
  m.dropout = c.dropout;
  m.moe.experts = c.moe_experts;
  m.moe.top_k = c.moe_top_k;
  m.moe.every = c.moe_every;
  m.moe.capacity_factor = c.moe_capacity_factor;
  m.arch = c.arch;
  if (c.arch == nn::Arch::Llama) {
    m.kv_heads = c.kv_heads;
    m.ffn_dim = c.ffn_dim;
    m.tie_embeddings = c.tie_embeddings;
    m.qkv_bias = c.qkv_bias;
    m.moe.ffn_dim = c.moe_ffn_dim;
    m.moe.shared_ffn_dim = c.moe_shared_ffn_dim;
    m.moe.shared_gate = c.moe_shared_gate;
  }
  if (!c.model.empty()) {  // --model config.json: the architecture is the file's, seq the flag's
    nlohmann::json j = io::parse_json(io::read_file(c.model));
    j["seq"] = c.seq;
    m = model_from_json(j, c.model);
    m.dropout = c.dropout;
  }
  return m;
}

Layout layout_of(const train::TrainConfig& c) {
  Layout l;
  l.dp = c.dp;
  l.tp = c.tp;
  l.pp = c.pp;
  l.ep = c.ep;
  l.cp = c.cp;
  l.cp_comm = c.cp_comm;
  l.sp = c.sp;
  l.zero = parallel::zero_stage(c.zero);
  l.zero_shard = train::parse_zero_shard_group(c.zero_shard_group);  // host: resolved per cluster
  l.schedule = c.schedule;
  l.virtual_stages = c.virtual_stages;
  l.micro_batch = c.micro_batch > 0 ? c.micro_batch : c.batch / c.dp;
  l.recompute = c.recompute;
  return l;
}

EngineOptions engine_options_of(const train::TrainConfig& c) {
  EngineOptions o;
  o.bucket_mb = c.bucket_mb;
  o.sgd = c.optimizer == train::OptimizerKind::Sgd;
  auto wire_bytes = [](DType t) { return static_cast<double>(dtype_size(t)); };
  o.grad_comm_bytes = wire_bytes(c.grad_reduce_dtype);
  o.param_gather_bytes = wire_bytes(train::resolve(c.param_gather_dtype, c.precision));
  const bool bf16 = c.precision == kernels::Precision::BF16;
  o.bf16_gemm_inputs = bf16;
  // As nn::GPTLayout's Auto: bf16 weight copies where the GEMMs run through oneDNN (on this
  // machine, for --bf16-gemm auto: the faster path, measured).
  if (bf16) {
    const kernels::Bf16Gemm g = c.bf16_gemm;
    const bool onednn = g == kernels::Bf16Gemm::OneDnn ||
                        (g == kernels::Bf16Gemm::Auto &&
                         kernels::resolve_bf16_gemm(g) == kernels::Bf16Gemm::OneDnn);
    o.bf16_weight_copies = nn::keeps_weight_copies(c.bf16_weight_copies, onednn);
  }
  o.activation_comm_bytes = wire_bytes(train::resolve(c.activation_comm_dtype, c.precision));
  return o;
}

}  // namespace tessera::plan
