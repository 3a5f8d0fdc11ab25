// `tessera schedule`: build a pipeline schedule, check it, simulate it with given costs, print
// every rank's actions, the bubble and the activation peaks, and draw it as SVG.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "tessera/core/error.h"
#include "tessera/io/atomic_file.h"
#include "tessera/parallel/pipeline/schedule_generators.h"
#include "tessera/parallel/pipeline/schedule_simulate.h"
#include "tessera/parallel/pipeline/schedule_validate.h"
#include "viz/plot_timeline.h"
#include "viz/svg.h"
#include "viz/timeline.h"

namespace tessera::app {
namespace {

struct ScheduleFlags {
  int pp = 0, micro_batches = 0, virtual_stages = 1;
  std::string schedule, costs = "1,2,1", svg;
  double p2p = 0;
};

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100 * fraction);
  return buf;
}

// The pipeline schedules' names, as --schedule takes them.
std::vector<std::string> schedule_names() {
  std::vector<std::string> names;
  for (parallel::ScheduleKind k : parallel::pipeline_schedules()) names.push_back(to_string(k));
  return names;
}

void run(const ScheduleFlags& f, int& exit_code) {
  std::vector<parallel::ActionCosts> rank_costs = parallel::parse_rank_costs(f.costs);
  for (parallel::ActionCosts& c : rank_costs) c.p2p = f.p2p;
  const parallel::Schedule s = parallel::make_schedule(parallel::parse_schedule(f.schedule), f.pp,
                                                       f.micro_batches, f.virtual_stages);
  TESSERA_CHECK_AS(ConfigError,
                   rank_costs.size() == 1 || rank_costs.size() == static_cast<size_t>(f.pp),
                   "--costs '", f.costs, "' gives ", rank_costs.size(),
                   " cost triples; give one F,B,W for every rank or one per rank (", f.pp,
                   "), separated by '/'");
  for (const parallel::ActionCosts& c : rank_costs) parallel::check_costs(c, s);
  const parallel::ActionCosts& costs = rank_costs.front();

  std::printf("schedule %s: pp=%d, %d micro-batches, %d chunk%s per rank (%d model stages)\n",
              s.name.c_str(), s.pp, s.micro_batches, s.virtual_stages,
              s.virtual_stages > 1 ? "s" : "", s.num_model_stages());
  for (int r = 0; r < s.pp; ++r) {
    std::string line = "rank " + std::to_string(r) + ":";
    for (const parallel::Action& a : s.ranks[static_cast<size_t>(r)]) {
      const bool transfer = parallel::is_send(a.kind) || parallel::is_recv(a.kind);
      line += transfer ? " [" : " ";
      line += parallel::to_string(a);
      if (transfer) line += ']';
    }
    std::printf("%s\n", line.c_str());
  }

  const std::vector<std::string> problems = parallel::validate_schedule(s);
  for (const std::string& p : problems) std::printf("invalid: %s\n", p.c_str());
  std::printf("validation: %s\n", problems.empty() ? "ok" : "FAILED");
  const parallel::Simulation sim = parallel::simulate(s, rank_costs);
  std::printf("deadlock check: %s\n", sim.deadlock.message().c_str());

  std::string cost_line = "costs:";
  for (size_t r = 0; r < rank_costs.size(); ++r) {
    const parallel::ActionCosts& c = rank_costs[r];
    if (rank_costs.size() > 1) cost_line += " rank " + std::to_string(r);
    cost_line += " F=" + viz::format_number(c.forward) + " B=" + viz::format_number(c.backward);
    if (parallel::traits(s.kind).splits_backward)
      cost_line += " (BI=" + viz::format_number(c.backward - c.weight) +
                   " W=" + viz::format_number(c.weight) + ")";
    if (r + 1 < rank_costs.size()) cost_line += ";";
  }
  cost_line += " p2p=" + viz::format_number(costs.p2p);
  if (s.virtual_stages > 1)
    cost_line += " per micro-batch through a rank's layers (1/" + std::to_string(s.virtual_stages) +
                 " per chunk)";
  std::printf("%s\n", cost_line.c_str());
  std::printf("step time: %s\n", viz::format_number(sim.makespan).c_str());
  std::string per_rank;
  for (double b : sim.bubble) per_rank += " " + percent(b);
  std::printf("bubble: %s of the step idle overall; per rank:%s\n",
              percent(sim.bubble_overall).c_str(), per_rank.c_str());
  if (const auto formula =
          rank_costs.size() == 1 ? parallel::closed_form_bubble(s, costs) : std::nullopt)
    std::printf("bubble formula: %s\n", percent(*formula).c_str());
  std::string peaks;
  for (size_t st = 0; st < sim.peak_in_flight.size(); ++st)
    peaks += " " + std::to_string(sim.peak_in_flight[st]);
  std::printf("peak micro-batches in flight per stage:%s\n", peaks.c_str());
  if (s.virtual_stages > 1) {
    std::string per_rank_act;
    for (double a : sim.peak_rank_activations) per_rank_act += " " + viz::format_number(a);
    std::printf("peak activations per rank (micro-batches through all its chunks):%s\n",
                per_rank_act.c_str());
  }
  if (!f.svg.empty()) {
    io::write_file_atomic(f.svg, viz::timeline_svg(viz::timeline_from_simulation(s, sim, costs)));
    std::printf("wrote %s\n", f.svg.c_str());
  }
  exit_code = problems.empty() && !sim.deadlock.deadlocked() ? 0 : 1;
}

}  // namespace

void register_schedule(CLI::App& root, int& exit_code) {
  auto f = std::make_shared<ScheduleFlags>();
  CLI::App* cmd = root.add_subcommand(
      "schedule",
      "Build a pipeline schedule, check it for deadlock, simulate it and draw it.\n"
      "Prints every rank's actions ([send/recv] are point-to-point transfers), the bubble (idle\n"
      "share of the step, per rank and overall) and the peak micro-batches whose activations each\n"
      "stage holds. Example: tessera schedule --pp 4 --micro-batches 8 --schedule zb-h1 --svg "
      "zb.svg");
  cmd->add_option("--pp", f->pp, "Pipeline ranks")->required()->check(CLI::Range(1, 256));
  cmd->add_option("--micro-batches", f->micro_batches, "Micro-batches per optimizer step")
      ->required()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--schedule", f->schedule, "gpipe, 1f1b, interleaved or zb-h1")
      ->required()
      ->check(CLI::IsMember(schedule_names()));
  cmd->add_option("--virtual-stages", f->virtual_stages,
                  "Model chunks per rank (interleaved only; needs micro-batches a multiple of pp)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--costs", f->costs,
                  "F,B,W: forward, whole backward and weight-gradient time of one micro-batch "
                  "through one rank's layers (B = BI + W when split); or one F,B,W per rank "
                  "separated by '/' for stages of unequal cost")
      ->capture_default_str();
  cmd->add_option("--p2p-cost", f->p2p, "Time from a send to the earliest end of its receive")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--svg", f->svg, "Write the simulated timeline as SVG to this file");
  cmd->callback([f, &exit_code]() { run(*f, exit_code); });
}

}  // namespace tessera::app
