#include "tessera/plan/report.h"

#include <algorithm>
#include <cstdio>

#include "tessera/core/allocator.h"

namespace tessera::plan {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string seconds(double s) {
  if (s >= 1) return fmt("%.3f s", s);
  if (s >= 1e-3) return fmt("%.2f ms", s * 1e3);
  return fmt("%.1f us", s * 1e6);
}

std::string pct(double f) {
  return fmt("%.1f%%", 100 * f);
}

std::string pad(std::string s, size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

std::string engine_of(const PlanRequest& r) {
  return r.engine.empty() ? r.cluster.engine : r.engine;
}
std::string precision_of(const PlanRequest& r) {
  return r.precision.empty() ? r.cluster.precision : r.precision;
}

}  // namespace

std::string describe_request(const PlanRequest& r) {
  const ClusterSpec& c = r.cluster;
  std::string s = describe(r.model) + "\n";
  s += "cluster: " + c.name + " (" + std::to_string(c.nodes) + " x " +
       std::to_string(c.devices_per_node) + " devices, " + format_bytes(c.memory_bytes()) +
       " each, " + precision_of(r) + " " + fmt("%.4g", c.peak_flops(precision_of(r)) / 1e12) +
       " TFLOP/s x " + fmt("%.2f", c.matmul_efficiency) + " achievable" +
       (c.gemm_efficiency.empty() ? "" : ", by GEMM shape for the tessera engine") + ")\n";
  s += "global batch " + std::to_string(r.global_batch) + " sequences x " +
       std::to_string(r.model.seq) + " tokens | engine " + engine_of(r) + "\n";
  return s;
}

std::string format_prediction(const PlanRequest& r, const Prediction& p) {
  std::string s = describe_request(r);
  s += "layout: " + p.layout.str() + "\n";
  if (!p.ok()) {
    for (const std::string& why : p.problems) s += "  cannot run: " + why + "\n";
    return s;
  }
  const MemoryTerms& m = p.memory;
  s += "memory per device (pipeline rank " + std::to_string(p.memory_rank) + ", the largest" +
       (p.layout.pp > 1 ? " of " + std::to_string(p.layout.pp) : std::string()) + "):\n";
  auto line = [&](const char* name, double v, const std::string& note = "") {
    s += "  " + pad(name, 22) + pad(format_bytes(v), 12) + note + "\n";
  };
  line("parameters", m.parameters);
  line("gradients", m.gradients);
  line("optimizer state", m.optimizer_state);
  line("activations", m.activations,
       fmt("(%.2f micro-batches in flight)", p.in_flight[static_cast<size_t>(p.memory_rank)]));
  line("communication buffers", m.buffers);
  if (m.reserved > 0) line("runtime reserve", m.reserved);
  line("total", m.total(),
       "of " + format_bytes(p.capacity) + (p.fits ? ": fits" : ": DOES NOT FIT"));
  if (!p.fits) s += "  " + p.why_not + "\n";
  if (p.layout.pp > 1) {
    s += "  per pipeline rank:";
    const size_t n = p.rank_memory.size();
    for (size_t i = 0; i < n; ++i) {
      if (n > 8 && i == 4) {  // the first four and the last two of a deep pipeline
        s += " ...";
        i = n - 3;
        continue;
      }
      s += " " + std::to_string(i) + ": " + format_bytes(p.rank_memory[i].total()) +
           (i + 1 < n ? "," : "");
    }
    s += "\n";
  }
  if (p.step_seconds <= 0) return s;
  const RankTime& rt = p.rank_time[static_cast<size_t>(p.critical_rank)];
  s += "step: " + seconds(p.step_seconds) + " (" + std::to_string(p.micro_batches) +
       " micro-batches of " + std::to_string(p.layout.micro_batch) + "; pipeline rank " +
       std::to_string(p.critical_rank) + ", which ends last: compute " + seconds(rt.compute) +
       " of which tp comm " + seconds(rt.tp_comm);
  if (rt.ep_comm > 0) s += " and ep all-to-all " + seconds(rt.ep_comm);
  if (p.layout.cp > 1) s += " and cp exposed " + seconds(rt.cp_exposed);
  s += ", dp comm " + seconds(rt.dp_comm) + " of which exposed " + seconds(rt.dp_exposed) +
       ", optimizer " + seconds(rt.optimizer) + ")\n";
  if (p.layout.pp > 1)
    s += "pipeline: bubble " + pct(p.bubble) + " of the compute phase (" +
         (p.simulated ? "simulated" : "estimated") + "), " + seconds(p.p2p_seconds) +
         " per transfer between stages\n";
  s += "throughput: " + fmt("%.4g", p.tokens_per_second) + " tokens/s, MFU " + pct(p.mfu) +
       ", HFU " + pct(p.hfu) + ", " + fmt("%.4g", p.tflops_per_device) +
       " TFLOP/s per device (recomputation included)\n";
  if (p.layout.cp > 1)
    s += "context parallelism: cp=" + std::to_string(p.layout.cp) + " " +
         nn::to_string(p.layout.cp_comm) + ", exchanges " + seconds(rt.cp_comm) + " per step, " +
         seconds(rt.cp_exposed) + " exposed" +
         (p.layout.cp_comm == nn::CpComm::Ring ? " (the rest hidden behind the attention)" : "") +
         "\n";
  s += "bytes sent per step by rank 0: data-parallel " + format_bytes(p.dp_bytes) +
       ", tensor-parallel " + format_bytes(p.tp_bytes) + ", pipeline " + format_bytes(p.p2p_bytes) +
       (p.layout.cp > 1 ? ", context-parallel " + format_bytes(p.cp_bytes) : std::string()) +
       (p.layout.ep > 1 ? ", expert-parallel " + format_bytes(p.ep_bytes) : std::string()) + "\n";
  if (p.nodes_spanned > 1) {
    const CrossNodeBytes& a = p.across;
    s +=
        "bytes between nodes per step (" + std::to_string(p.nodes_spanned) +
        " nodes summed, one process per node: --ranks-per-process): " + format_bytes(a.total()) +
        " (data-parallel " + format_bytes(a.data_parallel) + ", tensor-parallel " +
        format_bytes(a.tensor_parallel) + ", pipeline " + format_bytes(a.pipeline) +
        (p.layout.ep > 1 ? ", expert-parallel " + format_bytes(a.expert_parallel) : std::string()) +
        (a.cp_spans_nodes ? "; context-parallel exchanges across nodes not modelled"
                          : std::string()) +
        ")\n";
  }
  return s;
}

std::string format_ranking(const PlanRequest& r, const Ranking& k, int top) {
  std::string s = describe_request(r);
  s += std::to_string(k.considered) + " layouts of " + std::to_string(k.devices) + " devices (" +
       std::to_string(k.skipped) +
       " other combinations cannot run): " + std::to_string(k.fitting.size()) + " fit, " +
       std::to_string(k.not_fitting.size()) + " do not; the " + std::to_string(k.simulated) +
       " fastest estimates were simulated and re-ranked\n";
  size_t w = 8;
  for (size_t i = 0; i < k.fitting.size() && static_cast<int>(i) < top; ++i)
    w = std::max(w, k.fitting[i].layout.str().size() + 2);
  for (size_t i = 0; i < k.not_fitting.size() && static_cast<int>(i) < top; ++i)
    w = std::max(w, k.not_fitting[i].layout.str().size() + 2);
  if (!k.fitting.empty()) {
    s += pad("#", 5) + pad("layout", w) + pad("memory", 12) + pad("step", 12) +
         pad("tokens/s", 12) + pad("MFU", 8) + pad("bubble", 8) + "\n";
    for (size_t i = 0; i < k.fitting.size() && static_cast<int>(i) < top; ++i) {
      const Prediction& p = k.fitting[i];
      s += pad(std::to_string(i + 1), 5) + pad(p.layout.str(), w) +
           pad(format_bytes(p.memory.total()), 12) +
           pad(seconds(p.step_seconds) + (p.simulated ? "" : "*"), 12) +
           pad(fmt("%.4g", p.tokens_per_second), 12) + pad(pct(p.mfu), 8) +
           pad(p.layout.pp > 1 ? pct(p.bubble) : "-", 8) + "\n";
    }
    if (static_cast<int>(k.fitting.size()) > top)
      s += "(" + std::to_string(k.fitting.size() - top) +
           " more fit; * = estimated, not simulated)\n";
  }
  if (!k.not_fitting.empty()) {
    s += "do not fit (smallest first):\n";
    for (size_t i = 0; i < k.not_fitting.size() && static_cast<int>(i) < top; ++i)
      s += "  " + pad(k.not_fitting[i].layout.str(), w) + k.not_fitting[i].why_not + "\n";
    if (static_cast<int>(k.not_fitting.size()) > top)
      s += "  (" + std::to_string(k.not_fitting.size() - top) + " more)\n";
  }
  return s;
}

nlohmann::json to_json(const Prediction& p, bool per_rank) {
  nlohmann::json j = {{"layout", to_json(p.layout)}, {"layout_str", p.layout.str()}};
  if (!p.ok()) {
    j["problems"] = p.problems;
    return j;
  }
  j["fits"] = p.fits;
  if (!p.fits) j["why_not"] = p.why_not;
  j["capacity_bytes"] = p.capacity;
  j["memory"] = to_json(p.memory);
  j["memory_rank"] = p.memory_rank;
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t i = 0; i < (per_rank ? p.rank_memory.size() : 0); ++i) {
    nlohmann::json rj = to_json(p.rank_memory[i]);
    rj["in_flight"] = p.in_flight[i];
    if (i < p.rank_time.size()) {
      const RankTime& t = p.rank_time[i];
      rj["time"] = {{"compute", t.compute},       {"tp_comm", t.tp_comm},
                    {"ep_comm", t.ep_comm},       {"cp_comm", t.cp_comm},
                    {"cp_exposed", t.cp_exposed}, {"end_of_backward", t.end_of_backward},
                    {"dp_comm", t.dp_comm},       {"dp_exposed", t.dp_exposed},
                    {"optimizer", t.optimizer}};
    }
    ranks.push_back(rj);
  }
  if (per_rank) j["pipeline_ranks"] = ranks;
  j["micro_batches"] = p.micro_batches;
  j["critical_rank"] = p.critical_rank;
  if (p.step_seconds > 0) {
    j["simulated"] = p.simulated;
    j["step_seconds"] = p.step_seconds;
    j["bubble"] = p.bubble;
    j["p2p_seconds"] = p.p2p_seconds;
    j["tokens_per_second"] = p.tokens_per_second;
    j["mfu"] = p.mfu;
    j["hfu"] = p.hfu;
    j["tflops_per_device"] = p.tflops_per_device;
    j["model_flops_per_step"] = p.model_flops_per_step;
    j["hardware_flops_per_step"] = p.hardware_flops_per_step;
  }
  j["bytes_per_step"] = {{"data_parallel", p.dp_bytes},
                         {"tensor_parallel", p.tp_bytes},
                         {"pipeline", p.p2p_bytes},
                         {"context_parallel", p.cp_bytes},
                         {"expert_parallel", p.ep_bytes}};
  const CrossNodeBytes& a = p.across;
  j["bytes_across_nodes_per_step"] = {
      {"nodes", p.nodes_spanned},
      {"total", a.total()},
      {"data_parallel", a.data_parallel},
      {"tensor_parallel", a.tensor_parallel},
      {"pipeline", a.pipeline},
      {"expert_parallel", a.expert_parallel},
      {"context_parallel", a.cp_spans_nodes ? nlohmann::json() : nlohmann::json(0.0)}};
  return j;
}

nlohmann::json request_json(const PlanRequest& r) {
  return {{"model", to_json(r.model)},      {"cluster", r.cluster.name},
          {"devices", r.cluster.devices()}, {"global_batch", r.global_batch},
          {"engine", engine_of(r)},         {"precision", precision_of(r)}};
}

nlohmann::json to_json(const PlanRequest& r, const Ranking& k, int detailed) {
  nlohmann::json fit = nlohmann::json::array(), nofit = nlohmann::json::array();
  for (const Prediction& p : k.fitting)
    fit.push_back(to_json(p, static_cast<int>(fit.size()) < detailed));
  for (const Prediction& p : k.not_fitting)
    nofit.push_back(to_json(p, static_cast<int>(nofit.size()) < detailed));
  return {{"request", request_json(r)}, {"devices", k.devices},     {"considered", k.considered},
          {"skipped", k.skipped},       {"simulated", k.simulated}, {"fitting", fit},
          {"not_fitting", nofit}};
}

}  // namespace tessera::plan
