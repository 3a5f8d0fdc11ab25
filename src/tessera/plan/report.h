// `tessera plan`'s output: a prediction or a ranking as text for people and as JSON for scripts.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "tessera/plan/planner.h"

namespace tessera::plan {

std::string describe_request(const PlanRequest& r);  // model, cluster, batch, engine
std::string format_prediction(const PlanRequest& r, const Prediction& p);
// The `top` fastest layouts that fit as a table, then the first `top` that do not with why.
std::string format_ranking(const PlanRequest& r, const Ranking& k, int top);

// `per_rank`: every pipeline rank's memory terms and times too.
nlohmann::json to_json(const Prediction& p, bool per_rank = true);
// Every layout with its largest rank's memory and its step; the first `detailed` in full.
nlohmann::json to_json(const PlanRequest& r, const Ranking& k, int detailed);
nlohmann::json request_json(const PlanRequest& r);

}  // namespace tessera::plan
