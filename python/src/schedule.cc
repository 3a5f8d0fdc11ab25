// tessera.schedule: `tessera schedule`'s pipeline schedule (parallel/pipeline/): its actions per
// rank, validation, deadlock check, the simulated step with given costs, and the timeline drawn
// as SVG by the command's own drawing code (apps/viz, compiled into this module).
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "tessera/core/error.h"
#include "tessera/parallel/pipeline/schedule_generators.h"
#include "tessera/parallel/pipeline/schedule_simulate.h"
#include "tessera/parallel/pipeline/schedule_validate.h"
#include "viz/plot_timeline.h"
#include "viz/timeline.h"

namespace tessera::python {
namespace {

nb::object schedule(const std::string& kind, int pp, int micro_batches, int virtual_stages,
                    const std::string& costs, double p2p) {
  nlohmann::json out;
  {
    nb::gil_scoped_release unlocked;
    std::vector<parallel::ActionCosts> rank_costs = parallel::parse_rank_costs(costs);
    for (parallel::ActionCosts& c : rank_costs) c.p2p = p2p;
    const parallel::Schedule s =
        parallel::make_schedule(parallel::parse_schedule(kind), pp, micro_batches, virtual_stages);
    TESSERA_CHECK_AS(ConfigError,
                     rank_costs.size() == 1 || rank_costs.size() == static_cast<size_t>(pp),
                     "costs '", costs, "' gives ", rank_costs.size(),
                     " cost triples; give one F,B,W for every rank or one per rank (", pp, ")");
    for (const parallel::ActionCosts& c : rank_costs) parallel::check_costs(c, s);
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& actions : s.ranks) {
      nlohmann::json r = nlohmann::json::array();
      for (const parallel::Action& a : actions) r.push_back(parallel::to_string(a));
      ranks.push_back(r);
    }
    const parallel::Simulation sim = parallel::simulate(s, rank_costs);
    const std::optional<double> formula =
        rank_costs.size() == 1 ? parallel::closed_form_bubble(s, rank_costs.front()) : std::nullopt;
    out = {{"name", s.name},
           {"pp", s.pp},
           {"micro_batches", s.micro_batches},
           {"virtual_stages", s.virtual_stages},
           {"ranks", ranks},
           {"problems", parallel::validate_schedule(s)},
           {"deadlocked", sim.deadlock.deadlocked()},
           {"deadlock", sim.deadlock.message()},
           {"step_time", sim.makespan},
           {"bubble", sim.bubble_overall},
           {"rank_bubbles", sim.bubble},
           {"bubble_formula", formula ? nlohmann::json(*formula) : nlohmann::json()},
           {"peak_in_flight", sim.peak_in_flight},
           {"peak_rank_activations", sim.peak_rank_activations},
           {"svg", viz::timeline_svg(viz::timeline_from_simulation(s, sim, rank_costs.front()))}};
  }
  return to_python(out);
}

}  // namespace

void register_schedule(nb::module_& m) {
  m.def("_schedule", &schedule, nb::arg("kind"), nb::arg("pp"), nb::arg("micro_batches"),
        nb::arg("virtual_stages"), nb::arg("costs"), nb::arg("p2p"));
}

}  // namespace tessera::python
