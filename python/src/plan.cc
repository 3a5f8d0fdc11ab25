// tessera.plan and tessera.rank_layouts: `tessera plan`'s prediction and ranking, as the JSON the
// command writes with --json (plan/report.h), built from the same library calls as the command.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <optional>
#include <string>

#include "common.h"
#include "tessera/plan/calibrate.h"
#include "tessera/plan/cluster.h"
#include "tessera/plan/layout.h"
#include "tessera/plan/model_spec.h"
#include "tessera/plan/planner.h"
#include "tessera/plan/report.h"
#include "tessera/train/plan_of.h"
#include "tessera/train/train_config.h"

namespace tessera::python {
namespace {

// The request of `tessera plan` from the keys the Python functions pass, in the command's
// precedence: a training configuration (`config`, as --config: its model, batch and engine
// options) first, then the keys given (null: not given): model (a model JSON or config.json),
// batch, bucket_mb, optimizer, moe_skew; and cluster, engine, precision, link, dp_overlap,
// oversubscribe, devices (null: the cluster's).
plan::PlanRequest request_of(const nlohmann::json& j) {
  plan::PlanRequest r;
  const nlohmann::json& config = j.at("config");
  if (!config.is_null()) {
    const train::TrainConfig tc = train::train_config_from_json(config);
    r.model = plan::model_of(tc);
    r.engine_options = plan::engine_options_of(tc);
    r.global_batch = tc.batch;
  }
  if (!j.at("model").is_null())
    r.model = plan::model_from_json(j["model"], j.value("model_source", std::string("model")));
  plan::validate(r.model);
  if (!j.at("batch").is_null()) r.global_batch = j["batch"].get<int>();
  if (!j.at("bucket_mb").is_null()) r.engine_options.bucket_mb = j["bucket_mb"].get<double>();
  if (!j.at("optimizer").is_null())
    r.engine_options.sgd = j["optimizer"].get<std::string>() == "sgd";
  if (!j.at("moe_skew").is_null()) r.engine_options.moe_skew = j["moe_skew"].get<double>();
  r.cluster = plan::with_link(plan::load_cluster(j.at("cluster").get<std::string>()),
                              j.at("link").get<std::string>());
  r.engine = j.at("engine").get<std::string>();
  r.precision = j.at("precision").get<std::string>();
  if (!j.at("dp_overlap").is_null()) r.dp_overlap = j.at("dp_overlap").get<double>();
  r.oversubscribe = j.at("oversubscribe").get<bool>();
  if (!j.at("devices").is_null())
    r.cluster = plan::with_devices(r.cluster, j["devices"].get<int>());
  return r;
}

// The layout: a training configuration's (layout_of), then the keys given over it.
plan::Layout layout_of_request(const nlohmann::json& request, const nlohmann::json& given,
                               const char* source) {
  nlohmann::json keys = nlohmann::json::object();
  if (!request.at("config").is_null())
    keys = plan::to_json(plan::layout_of(train::train_config_from_json(request["config"])));
  for (const auto& [k, v] : given.items()) keys[k] = v;
  return plan::layout_from_json(keys, source);
}

// The devices a ranking is for: `devices`, or the cluster's.
int devices_of(const nlohmann::json& j, const plan::PlanRequest& r) {
  return j.at("devices").is_null() ? r.cluster.devices() : j["devices"].get<int>();
}

nb::object plan_one(nb::handle request, nb::handle layout) {
  const nlohmann::json rj = to_json(request), lj = to_json(layout);
  nlohmann::json out;
  {
    nb::gil_scoped_release unlocked;
    const plan::PlanRequest r = request_of(rj);
    plan::Layout l = layout_of_request(rj, lj, "layout");
    // As the command: micro_batch unset or 0 is the batch over the data-parallel ranks.
    if (rj.at("config").is_null() && !lj.contains("micro_batch")) l.micro_batch = 0;
    if (l.micro_batch == 0) l.micro_batch = std::max(1, r.global_batch / l.dp);
    const plan::Prediction p = plan::plan_layout(r, l);
    out = {{"request", plan::request_json(r)},
           {"prediction", plan::to_json(p)},
           {"text", plan::format_prediction(r, p)}};
  }
  return to_python(out);
}

template <typename T, typename F>
void fix(std::optional<T>& field, const nlohmann::json& j, const char* key, F parse) {
  if (j.contains(key) && !j[key].is_null()) field = parse(j[key]);
}

nb::object rank(nb::handle request, nb::handle fixed, int max_cp, int simulate_top, int top) {
  const nlohmann::json rj = to_json(request), fj = to_json(fixed);
  nlohmann::json out;
  {
    nb::gil_scoped_release unlocked;
    const plan::PlanRequest r = request_of(rj);
    // The held keys are checked as a layout's (unknown keys are a ConfigError).
    const plan::Layout held = layout_of_request(rj, fj, "fixed");
    plan::LayoutSpace s;
    // As the command: a configuration's context parallelism is held too.
    if (held.cp > 1) s.cp = held.cp;
    auto as_int = [](const nlohmann::json& v) { return v.get<int>(); };
    fix(s.dp, fj, "dp", as_int);
    fix(s.tp, fj, "tp", as_int);
    fix(s.pp, fj, "pp", as_int);
    fix(s.ep, fj, "ep", as_int);
    fix(s.cp, fj, "cp", as_int);
    fix(s.virtual_stages, fj, "virtual_stages", as_int);
    fix(s.micro_batch, fj, "micro_batch", as_int);
    fix(s.cp_comm, fj, "cp_comm",
        [](const nlohmann::json& v) { return nn::parse_cp_comm(v.get<std::string>()); });
    fix(s.zero, fj, "zero",
        [](const nlohmann::json& v) { return parallel::zero_stage(v.get<int>()); });
    fix(s.sp, fj, "sp", [](const nlohmann::json& v) { return v.get<bool>(); });
    // HSDP's shard group ("host" or a number), as the command holds it.
    if (fj.contains("zero_shard") || held.zero_shard != 0) s.zero_shard = held.zero_shard;
    fix(s.schedule, fj, "schedule",
        [](const nlohmann::json& v) { return parallel::parse_schedule(v.get<std::string>()); });
    fix(s.recompute, fj, "recompute",
        [](const nlohmann::json& v) { return nn::parse_recompute(v.get<std::string>()); });
    s.max_cp = max_cp;
    const plan::Ranking k = plan::rank_layouts(r, devices_of(rj, r), s, simulate_top);
    out = plan::to_json(r, k, top);
    out["text"] = plan::format_ranking(r, k, top);
  }
  return to_python(out);
}

}  // namespace

void register_plan(nb::module_& m) {
  m.def("_plan", &plan_one, nb::arg("request"), nb::arg("layout"));
  m.def("_rank_layouts", &rank, nb::arg("request"), nb::arg("fixed"), nb::arg("max_cp"),
        nb::arg("simulate_top"), nb::arg("top"));
  m.def("_cluster_names", &plan::shipped_cluster_names);
}

}  // namespace tessera::python
