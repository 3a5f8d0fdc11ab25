// methods_report RESULTS.json METHODS.md SVG_DIR: writes the measured methods table
// (docs/METHODS.md) and its charts from bench/methods/run.sh's results: per method the measured
// tokens/s, peak memory per rank, data-parallel bytes per step and pipeline bubble beside `tessera
// plan`'s prediction, then the seed's pros and cons of each method as the numbers of this run.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "viz/svg.h"

namespace {

using nlohmann::json;
using tessera::viz::format_number;
using tessera::viz::nice_ticks;
using tessera::viz::Svg;

std::optional<double> num(const json& j, const std::vector<std::string>& path) {
  const json* p = &j;
  for (const std::string& k : path) {
    if (!p->is_object() || !p->contains(k)) return std::nullopt;
    p = &p->at(k);
  }
  if (!p->is_number()) return std::nullopt;
  return p->get<double>();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string mib(std::optional<double> b) {
  return b ? fmt("%.1f", *b / 1048576.0) : "-";
}
std::string pct(std::optional<double> f) {
  return f ? fmt("%.1f%%", 100 * *f) : "-";
}
std::string err(std::optional<double> planned, std::optional<double> measured) {
  if (!planned || !measured || *measured == 0) return "-";
  return fmt("%+.0f%%", 100 * (*planned / *measured - 1));
}
std::string rate(std::optional<double> v) {
  return v ? fmt("%.0f", *v) : "-";
}

struct Method {
  json j;
  std::string name() const { return j["name"]; }
  bool measured() const { return j.value("available", false) && j.contains("measured"); }
  std::optional<double> m(const std::string& k) const { return num(j, {"measured", k}); }
  std::optional<double> p(const std::vector<std::string>& path) const {
    std::vector<std::string> full = {"predicted"};
    full.insert(full.end(), path.begin(), path.end());
    return num(j, full);
  }
  std::optional<double> planned_peak() const {
    if (!j.contains("predicted") || !j["predicted"].contains("pipeline_ranks")) return std::nullopt;
    double best = 0;
    for (const json& r : j["predicted"]["pipeline_ranks"])
      best = std::max(best, r["total"].get<double>());
    return best;
  }
  // The planned memory terms of the largest rank.
  std::vector<double> planned_terms() const {
    std::vector<double> t(5, 0);
    if (!j.contains("predicted") || !j["predicted"].contains("memory")) return t;
    const json& m = j["predicted"]["memory"];
    int i = 0;
    for (const char* k : {"parameters", "gradients", "optimizer_state", "activations", "buffers"})
      t[i++] = m.value(k, 0.0);
    return t;
  }
};

const char* kMeasured = "#3b6fb6";
const char* kPlanned = "#a9c4ea";
const char* kTerms[5] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#b07aa1"};
const char* kTermNames[5] = {"parameters", "gradients", "optimizer state", "activations",
                             "buffers"};

// Horizontal bars: one row per method, up to two bars (measured, planned) per row.
std::string bar_chart(const std::string& title, const std::string& unit,
                      const std::vector<std::string>& labels,
                      const std::vector<std::optional<double>>& measured,
                      const std::vector<std::optional<double>>& planned) {
  const double left = 250, right = 40, top = 50, row = 34, width = 900;
  const double height = top + row * labels.size() + 60;
  double hi = 0;
  for (auto v : measured) hi = std::max(hi, v.value_or(0));
  for (auto v : planned) hi = std::max(hi, v.value_or(0));
  if (hi <= 0) hi = 1;
  const std::vector<double> ticks = nice_ticks(0, hi, 6);
  hi = std::max(hi, ticks.back());
  const double plot = width - left - right;
  auto x = [&](double v) { return left + plot * v / hi; };
  Svg s(width, height);
  s.text(width / 2, 24, title, 16, "middle", "#222", true);
  for (double t : ticks) {
    s.line(x(t), top - 6, x(t), top + row * labels.size(), "#ddd");
    s.text(x(t), top + row * labels.size() + 16, format_number(t), 11, "middle");
  }
  s.text(left + plot / 2, height - 18, unit, 12, "middle");
  for (size_t i = 0; i < labels.size(); ++i) {
    const double y = top + row * i;
    s.text(left - 8, y + row / 2 + 4, labels[i], 12, "end");
    if (measured[i])
      s.rect(left, y + 4, x(*measured[i]) - left, 12, kMeasured,
             labels[i] + " measured: " + format_number(*measured[i]), "", "measured");
    else
      s.text(left + 4, y + 14, "not available in this build", 10, "start", "#999");
    if (planned[i])
      s.rect(left, y + 17, x(*planned[i]) - left, 12, kPlanned,
             labels[i] + " planned: " + format_number(*planned[i]), "", "planned");
  }
  s.rect(left, height - 44, 12, 10, kMeasured);
  s.text(left + 16, height - 35, "measured", 11);
  s.rect(left + 100, height - 44, 12, 10, kPlanned);
  s.text(left + 116, height - 35, "planned (tessera plan)", 11);
  return s.str();
}

// Stacked planned memory terms per method, the measured peak as a black tick.
std::string memory_chart(const std::vector<Method>& ms) {
  const double left = 250, right = 40, top = 50, row = 26, width = 900;
  const double height = top + row * ms.size() + 70;
  double hi = 0;
  for (const Method& m : ms) {
    double sum = 0;
    for (double t : m.planned_terms()) sum += t;
    hi = std::max({hi, sum, m.m("memory_peak").value_or(0)});
  }
  hi /= 1048576.0;
  const std::vector<double> ticks = nice_ticks(0, hi, 6);
  hi = std::max(hi, ticks.back());
  const double plot = width - left - right;
  auto x = [&](double b) { return left + plot * (b / 1048576.0) / hi; };
  Svg s(width, height);
  s.text(width / 2, 24, "Peak memory per rank (MiB): planned terms, measured peak", 16, "middle",
         "#222", true);
  for (double t : ticks) {
    s.line(left + plot * t / hi, top - 6, left + plot * t / hi, top + row * ms.size(), "#ddd");
    s.text(left + plot * t / hi, top + row * ms.size() + 16, format_number(t), 11, "middle");
  }
  for (size_t i = 0; i < ms.size(); ++i) {
    const double y = top + row * i;
    s.text(left - 8, y + row / 2 + 4, ms[i].name(), 12, "end");
    double at = 0;
    const std::vector<double> t = ms[i].planned_terms();
    for (int k = 0; k < 5; ++k) {
      if (t[k] <= 0) continue;
      s.rect(x(at), y + 5, x(at + t[k]) - x(at), row - 10, kTerms[k],
             ms[i].name() + ": " + kTermNames[k] + " " + fmt("%.2f MiB", t[k] / 1048576.0));
      at += t[k];
    }
    if (auto peak = ms[i].m("memory_peak")) {
      s.line(x(*peak), y + 1, x(*peak), y + row - 1, "#000", 3);
    }
  }
  double lx = left;
  for (int k = 0; k < 5; ++k) {
    s.rect(lx, height - 40, 12, 10, kTerms[k]);
    s.text(lx + 16, height - 31, kTermNames[k], 11);
    lx += 24 + tessera::viz::text_width(kTermNames[k], 11);
  }
  s.line(lx, height - 44, lx, height - 28, "#000", 3);
  s.text(lx + 8, height - 31, "measured peak", 11);
  return s.str();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: methods_report RESULTS.json METHODS.md SVG_DIR\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  const json r = json::parse(in);
  const std::string svg_dir = argv[3];
  std::vector<Method> ms;
  for (const json& j : r["methods"]) ms.push_back(Method{j});
  auto find = [&](const std::string& name) -> const Method* {
    for (const Method& m : ms)
      if (m.name() == name) return &m;
    return nullptr;
  };

  std::vector<std::string> labels;
  std::vector<std::optional<double>> tok_m, tok_p, dp_m, dp_p, bub_m, bub_p;
  std::vector<std::string> pipe_labels;
  for (const Method& m : ms) {
    labels.push_back(m.name());
    tok_m.push_back(m.measured() ? m.m("tokens_per_second") : std::nullopt);
    tok_p.push_back(m.p({"tokens_per_second"}));
    dp_m.push_back(m.measured() ? m.m("dp_bytes_per_step") : std::nullopt);
    dp_p.push_back(m.p({"bytes_per_step", "data_parallel"}));
    if (m.j["flags"].get<std::string>().find("--pp") != std::string::npos) {
      pipe_labels.push_back(m.name());
      bub_m.push_back(m.measured() ? m.m("bubble") : std::nullopt);
      bub_p.push_back(m.p({"bubble"}));
    }
  }
  auto scale = [](std::vector<std::optional<double>> v, double f) {
    for (auto& x : v)
      if (x) *x *= f;
    return v;
  };
  write(svg_dir + "/throughput.svg",
        bar_chart("Training throughput", "tokens/s (higher is better)", labels, tok_m, tok_p));
  write(svg_dir + "/memory.svg", memory_chart(ms));
  write(svg_dir + "/bytes.svg",
        bar_chart("Data-parallel bytes sent per rank per step", "MiB", labels,
                  scale(dp_m, 1 / 1048576.0), scale(dp_p, 1 / 1048576.0)));
  write(svg_dir + "/bubble.svg",
        bar_chart("Pipeline bubble (idle share of the step)", "% of the step", pipe_labels,
                  scale(bub_m, 100), scale(bub_p, 100)));

  std::ostringstream md;
  md << "# The methods, measured\n\n"
     << "Generated by `bash bench/methods/run.sh` (docs/PLANNER.md) from one recorded run: "
     << r.value("date", "?") << " on " << r.value("host", "?") << " (" << r.value("cores", 0)
     << " cores; `" << r.value("load", "") << "`). " << r.value("model", "") << ", "
     << r.value("steps", 0)
     << " steps, one BLAS thread per rank (ranks beyond the cores time-share them); the planner "
        "ran with `--cluster "
     << r.value("cluster", "?")
     << " --oversubscribe`. Measured figures are medians over the steps after the first. "
        "The raw results are in `docs/methods/results.json`.\n\n";
  // A load average above the core count means ranks did not have a core each.
  const std::string load = r.value("load", "");
  const size_t at = load.find("load average:");
  const double avg = at == std::string::npos ? 0 : std::atof(load.c_str() + at + 13);
  if (avg > r.value("cores", 0))
    md << "**This run's load average (" << fmt("%.1f", avg) << ") exceeded the "
       << r.value("cores", 0)
       << " cores:** the ranks did not get a core each, so the measured tokens/s are far below the "
          "planned ones, which assume a core per rank (`docs/PLANNER.md`, validation (a), compares "
          "CPU time instead). Memory and bytes do not depend on the load, the bubbles little.\n\n";
  md << "| method | tokens/s measured | planned | error | peak MiB/rank measured | planned | "
        "error | dp bytes/step measured (MiB) | planned | tp bytes/step measured (MiB) | planned "
        "| pipeline bytes/step measured (MiB) | planned | bubble measured | planned |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Method& m : ms) {
    const bool meas = m.measured();
    auto mv = [&](const char* k) { return meas ? m.m(k) : std::nullopt; };
    md << "| " << m.name();
    if (!meas)
      md << " ("
         << (m.j.value("missing", "").empty()
                 ? "not run"
                 : "not available in this build: " + m.j.value("missing", std::string()))
         << ")";
    md << " | " << rate(mv("tokens_per_second")) << " | " << rate(m.p({"tokens_per_second"}))
       << " | " << err(m.p({"tokens_per_second"}), mv("tokens_per_second")) << " | "
       << mib(mv("memory_peak")) << " | " << mib(m.planned_peak()) << " | "
       << err(m.planned_peak(), mv("memory_peak")) << " | " << mib(mv("dp_bytes_per_step")) << " | "
       << mib(m.p({"bytes_per_step", "data_parallel"})) << " | " << mib(mv("tp_bytes_per_step"))
       << " | " << mib(m.p({"bytes_per_step", "tensor_parallel"})) << " | "
       << mib(mv("pp_bytes_per_step")) << " | " << mib(m.p({"bytes_per_step", "pipeline"}))
       << " | ";
    const bool pipe = m.j["flags"].get<std::string>().find("--pp") != std::string::npos;
    md << (pipe ? pct(mv("bubble")) : "-") << " | " << (pipe ? pct(m.p({"bubble"})) : "-")
       << " |\n";
  }
  md << "\nMeasured bytes are what each rank's engines count as sent in the last step (the "
        "metrics' `comm_bytes_per_rank` less `tp_bytes_per_rank`, `tp_bytes_per_rank` and "
        "`pp_bytes_per_rank`; collectives in ring accounting); expert all-to-all and "
        "context-parallel bytes are not in these columns. The measured bubble is the executor's "
        "(idle share up to each rank's last backward, averaged over the stages); the planned one "
        "is the simulator's for the planner's stage costs.\n\n"
     << "![throughput](methods/throughput.svg)\n\n![memory](methods/memory.svg)\n\n"
     << "![bytes](methods/bytes.svg)\n\n![bubble](methods/bubble.svg)\n\n";

  // The seed's pros and cons, as this run's numbers.
  auto tok = [&](const std::string& n) -> std::optional<double> {
    const Method* m = find(n);
    return m && m->measured() ? m->m("tokens_per_second") : std::nullopt;
  };
  auto peak = [&](const std::string& n) -> std::optional<double> {
    const Method* m = find(n);
    return m && m->measured() ? m->m("memory_peak") : std::nullopt;
  };
  auto ratio = [](std::optional<double> a, std::optional<double> b) -> std::string {
    return a && b && *b != 0 ? fmt("%.2fx", *a / *b) : "n/a";
  };
  auto bubble = [&](const std::string& n) -> std::string {
    const Method* m = find(n);
    return m && m->measured() ? pct(m->m("bubble")) : "n/a";
  };
  md << "## The seed's pros and cons, as numbers\n\n"
     << "| method | the seed says | this run |\n|---|---|---|\n"
     << "| data parallelism | general; total memory is large (everything replicated) | dp=2 runs "
        "at "
     << ratio(tok("dp=2"), tok("one rank")) << " the one-rank tokens/s with "
     << ratio(peak("dp=2"), peak("one rank"))
     << " of its memory on every rank; ZeRO-1/2/3 bring the per-rank peak to "
     << ratio(peak("dp=2 ZeRO-1"), peak("dp=2")) << ", " << ratio(peak("dp=2 ZeRO-2"), peak("dp=2"))
     << ", " << ratio(peak("dp=2 ZeRO-3"), peak("dp=2"))
     << " of plain dp=2 (ZeRO-3 at dp=4: " << ratio(peak("dp=4 ZeRO-3"), peak("dp=2")) << ") |\n"
     << "| tensor parallelism | memory efficient; less general, heavy communication | tp=2 holds "
     << ratio(peak("tp=2"), peak("one rank")) << " of one rank's memory per rank and runs at "
     << ratio(tok("tp=2"), tok("one rank"))
     << " its tokens/s; it all-reduces activations in every block (see the planned tp bytes) |\n"
     << "| pipelines | general, higher utilisation; unbalanced stages, bubbles | bubbles measured: "
        "gpipe "
     << bubble("pp=2 gpipe") << ", 1f1b " << bubble("pp=2 1f1b") << ", interleaved "
     << bubble("pp=2 interleaved v=2") << ", zb-h1 " << bubble("pp=2 zb-h1")
     << "; 1f1b's peak memory per rank is " << ratio(peak("pp=2 1f1b"), peak("pp=2 gpipe"))
     << " of gpipe's |\n"
     << "| recomputation | keep only each stage's input, recompute in backward | selective: "
     << ratio(tok("recompute selective"), tok("one rank")) << " tokens/s, "
     << ratio(peak("recompute selective"), peak("one rank"))
     << " memory; full: " << ratio(tok("recompute full"), tok("one rank")) << " tokens/s, "
     << ratio(peak("recompute full"), peak("one rank")) << " memory |\n"
     << "| hybrid | tensor inside a server, pipeline and data across | dp=2 tp=2 pp=2 on 8 "
        "ranks: "
     << ratio(peak("dp=2 tp=2 pp=2 (3D)"), peak("one rank")) << " of one rank's memory per rank |\n"
     << "| mixture of experts | experts routed by all-to-all | "
     << (tok("MoE 4 experts, ep=2") ? "ep=2: " + ratio(tok("MoE 4 experts, ep=2"), tok("dp=2")) +
                                          " the dense dp=2 tokens/s"
                                    : std::string("not available in this build (planned only)"))
     << " |\n"
     << "| context parallelism (after the seed) | each sequence split over ranks; attention "
        "exchanges keys and values | cp=2 holds "
     << ratio(peak("cp=2 ring"), peak("one rank"))
     << " of one rank's memory per rank; tokens/s over one rank: all-gather "
     << ratio(tok("cp=2 all-gather"), tok("one rank")) << ", ring "
     << ratio(tok("cp=2 ring"), tok("one rank")) << ", ulysses "
     << ratio(tok("cp=2 ulysses"), tok("one rank")) << " |\n"
     << "| hybrid sharding (HSDP, after the seed) | ZeRO inside a host, replicas across | dp=4 "
        "ZeRO-3 in shard groups of 2: "
     << ratio(peak("dp=4 ZeRO-3, shard groups of 2 (HSDP)"), peak("dp=4 ZeRO-3"))
     << " of plain ZeRO-3's memory per rank, for fewer bytes across hosts (docs/CLUSTER.md) |\n";
  write(argv[2], md.str());
  return 0;
}
