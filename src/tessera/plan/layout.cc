#include "tessera/plan/layout.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/nn/context_parallel_attention.h"

namespace tessera::plan {

std::string Layout::str() const {
  std::string s =
      "dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp);
  if (cp > 1) s += " cp=" + std::to_string(cp) + " " + nn::to_string(cp_comm);
  if (ep > 1) s += " ep=" + std::to_string(ep);
  s += " zero=" + std::to_string(parallel::to_int(zero));
  if (zero_shard > 0 && zero_shard < gradient_ranks())
    s += " shard=" + std::to_string(zero_shard);  // HSDP
  if (sp) s += " sp";
  if (pp > 1) {
    s += std::string(" ") + parallel::to_string(schedule);
    if (virtual_stages > 1) s += " v=" + std::to_string(virtual_stages);
  }
  s += " mb=" + std::to_string(micro_batch) + " recompute=" + nn::to_string(recompute);
  return s;
}

std::vector<std::string> layout_problems(const Layout& l, const ModelSpec& m, int global_batch,
                                         bool uneven_stages) {
  std::vector<std::string> p;
  auto add = [&](auto&&... parts) { p.push_back(detail::concat(parts...)); };
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.ep < 1 || l.cp < 1 || l.micro_batch < 1 ||
      l.virtual_stages < 1) {
    add("every degree (dp, tp, pp, ep, cp), the micro-batch and the virtual stages must be "
        "positive");
    return p;
  }
  if (m.heads % l.tp != 0) {
    add("tp=", l.tp, " must divide the ", m.heads, " attention heads");
  } else if (const int kv = to_gpt_config(m).kv_heads(); kv % l.tp != 0) {
    // Tensor parallelism splits the key/value heads, as tessera's trainer and Megatron-LM do
    // (neither replicates a head over tensor-parallel ranks).
    add("tp=", l.tp, " must divide the ", kv, " key/value heads (grouped-query attention)");
  }
  if (l.cp > 1) {
    if (m.seq % (2 * l.cp) != 0)
      add("cp=", l.cp, " cuts each sequence into 2 x cp = ", 2 * l.cp,
          " chunks (rank r holding chunks r and 2cp-1-r): it must divide the sequence length ",
          m.seq);
    const nn::GPTConfig c = to_gpt_config(m);
    if (c.n_head % l.tp == 0 && c.kv_heads() % l.tp == 0) {
      try {  // Ulysses' head rule, as the trainer checks it (train/run_plan.cc)
        nn::check_context_heads(
            l.cp_comm, l.cp,
            kernels::AttentionHeads{c.n_head / l.tp, c.kv_heads() / l.tp, c.head_dim()});
      } catch (const ConfigError& e) {
        add(e.what());
      }
    }
  }
  if (l.zero_shard == Layout::kShardByHost)
    add("zero_shard=host is resolved on a cluster (the planner does it before it checks a layout)");
  else if (l.zero_shard < 0 || (l.zero_shard > 0 && l.gradient_ranks() % l.zero_shard != 0))
    add("the ZeRO shard group (zero_shard=", l.zero_shard, ") must divide the ", l.gradient_ranks(),
        " ranks that share the gradients (dp x cp)");
  else if (l.zero_shard > 0 && l.zero_shard < l.gradient_ranks() &&
           !parallel::traits(l.zero).sharded())
    add("a ZeRO shard group smaller than dp x cp (HSDP, zero_shard=", l.zero_shard,
        ") needs zero 1, 2 or 3");
  if (l.sp && l.tp == 1)
    add("sequence parallelism splits the tensor-parallel group's sequence: it needs tp > 1");
  if (l.sp && m.seq % l.tp != 0)
    add("sequence parallelism needs tp=", l.tp, " to divide the sequence length ", m.seq);
  if (global_batch % (l.dp * l.micro_batch) != 0)
    add("the global batch (", global_batch,
        ") must be a multiple of dp x micro-batch = ", l.dp * l.micro_batch);
  if (l.ep > 1) {
    if (!m.moe.enabled())
      add("ep=", l.ep, " needs a mixture-of-experts model (--moe-experts)");
    else if (m.moe.experts % l.ep != 0)
      add("ep=", l.ep, " must divide the ", m.moe.experts, " experts");
    if (l.dp % l.ep != 0)
      add("ep=", l.ep, " must divide dp=", l.dp,
          " (expert groups are runs of data-parallel ranks)");
  }
  if (l.pp == 1) {
    if (l.virtual_stages != 1) add("virtual stages need pipeline parallelism (pp > 1)");
    return p;
  }
  if (!parallel::traits(l.schedule).pipelined) {
    add("the ", parallel::to_string(l.schedule), " schedule is not a pipeline schedule");
    return p;
  }
  const int stages = l.pp * l.virtual_stages;
  if (parallel::traits(l.schedule).interleaved) {
    if (l.virtual_stages < 2) add("the interleaved schedule needs at least 2 virtual stages");
    if (global_batch % (l.dp * l.micro_batch) == 0 && l.micro_batches(global_batch) % l.pp != 0)
      add("the interleaved schedule needs the micro-batches per pipeline (",
          l.micro_batches(global_batch), ") to be a multiple of pp=", l.pp);
  } else if (l.virtual_stages != 1) {
    add("only the interleaved schedule runs virtual stages");
  }
  if (uneven_stages) {
    if (stages > m.layers + 2)
      add("pp x virtual stages = ", stages, " model stages, more than the ", m.layers + 2,
          " units (embedding, blocks, head)");
  } else if (stages > m.layers) {
    add("pp x virtual stages = ", stages, " model stages, more than the ", m.layers, " layers");
  }
  return p;
}

nlohmann::json to_json(const Layout& l) {
  return {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"ep", l.ep},
          {"cp", l.cp},
          {"cp_comm", nn::to_string(l.cp_comm)},
          {"zero", parallel::to_int(l.zero)},
          {"zero_shard", l.zero_shard == Layout::kShardByHost ? nlohmann::json("host")
                                                              : nlohmann::json(l.zero_shard)},
          {"sp", l.sp},
          {"schedule", parallel::to_string(l.schedule_kind())},
          {"virtual_stages", l.virtual_stages},
          {"micro_batch", l.micro_batch},
          {"recompute", nn::to_string(l.recompute)}};
}

Layout layout_from_json(const nlohmann::json& j, const std::string& source) {
  TESSERA_CHECK_AS(ConfigError, j.is_object(), source, ": a layout must be a JSON object");
  Layout l;
  for (const auto& [k, v] : j.items()) {
    auto integer = [&]() {
      TESSERA_CHECK_AS(ConfigError, v.is_number_integer(), source, ": '", k,
                       "' must be an integer, got ", v.dump());
      return v.get<int>();
    };
    if (k == "dp")
      l.dp = integer();
    else if (k == "tp")
      l.tp = integer();
    else if (k == "pp")
      l.pp = integer();
    else if (k == "ep")
      l.ep = integer();
    else if (k == "cp")
      l.cp = integer();
    else if (k == "zero")
      l.zero = parallel::zero_stage(integer());
    else if (k == "zero_shard")
      l.zero_shard =
          v.is_string() && v.get<std::string>() == "host" ? Layout::kShardByHost : integer();
    else if (k == "virtual_stages")
      l.virtual_stages = integer();
    else if (k == "micro_batch")
      l.micro_batch = integer();
    else if (k == "sp") {
      TESSERA_CHECK_AS(ConfigError, v.is_boolean(), source, ": 'sp' must be true or false");
      l.sp = v.get<bool>();
    } else if (k == "schedule") {
      TESSERA_CHECK_AS(ConfigError, v.is_string(), source, ": 'schedule' must be a string");
      const std::string name = v.get<std::string>();
      l.schedule =
          name == "single" ? parallel::ScheduleKind::OneFOneB : parallel::parse_schedule(name);
    } else if (k == "cp_comm") {
      TESSERA_CHECK_AS(ConfigError, v.is_string(), source, ": 'cp_comm' must be a string");
      l.cp_comm = nn::parse_cp_comm(v.get<std::string>());
    } else if (k == "recompute") {
      TESSERA_CHECK_AS(ConfigError, v.is_string(), source, ": 'recompute' must be a string");
      l.recompute = nn::parse_recompute(v.get<std::string>());
    } else {
      throw ConfigError(detail::concat(source, ": unknown layout key '", k, "'"));
    }
  }
  return l;
}

}  // namespace tessera::plan
