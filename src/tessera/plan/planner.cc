#include "tessera/plan/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "tessera/core/allocator.h"
#include "tessera/core/error.h"
#include "tessera/parallel/pipeline/schedule.h"
#include "tessera/parallel/pipeline/schedule_generators.h"
#include "tessera/parallel/pipeline/schedule_simulate.h"
#include "tessera/plan/collectives.h"
#include "tessera/plan/context_parallel.h"

namespace tessera::plan {

namespace {

using ScheduleKey = std::tuple<parallel::ScheduleKind, int, int, int>;  // kind, pp, m, v

// The schedules (and their in-flight counts) of one request, built once each.
class ScheduleCache {
 public:
  const parallel::Schedule& schedule(const Layout& l, int m) { return entry(l, m).schedule; }
  const parallel::InFlight& in_flight(const Layout& l, int m) { return entry(l, m).in_flight; }

 private:
  struct Entry {
    parallel::Schedule schedule;
    parallel::InFlight in_flight;
  };
  Entry& entry(const Layout& l, int m) {
    const ScheduleKey key{l.schedule_kind(), l.pp, m, l.virtual_stages};
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      Entry e;
      e.schedule = l.pp == 1 ? parallel::single_stage_schedule(m)
                             : parallel::make_schedule(l.schedule, l.pp, m, l.virtual_stages);
      e.in_flight = parallel::count_in_flight(e.schedule);
      it = cache_.emplace(key, std::move(e)).first;
    }
    return it->second;
  }
  std::map<ScheduleKey, Entry> cache_;
};

std::string gib(double bytes) {
  return format_bytes(bytes);
}

// The part of `t` seconds of communication not hidden behind `window` seconds of compute, when a
// fraction `overlap` of it can run concurrently.
double exposed(double t, double window, double overlap) {
  return (1 - overlap) * t + std::max(0.0, overlap * t - window);
}

enum class Timing { None, EstimateIfFits, Simulate };

class Evaluator {
 public:
  explicit Evaluator(const PlanRequest& r) : r_(r) {
    validate(r.model);
    TESSERA_CHECK_AS(ConfigError, r.global_batch >= 1, "--batch must be positive, got ",
                     r.global_batch);
    EngineOptions options = r.engine_options;
    if (options.gemm_efficiency.empty()) {
      options.gemm_efficiency = r.cluster.gemm_efficiency;
      options.attention_efficiency = r.cluster.attention_efficiency;
    }
    TESSERA_CHECK_AS(ConfigError, options.moe_skew >= 1, "--moe-skew is the busiest rank's rows ",
                     "over balanced routing, at least 1, got ", options.moe_skew);
    // A skew needs per-GEMM costs: without a table, one point at the cluster's one efficiency.
    if (options.moe_skew != 1 && options.gemm_efficiency.empty())
      options.gemm_efficiency = GemmEfficiency({1}, {r.cluster.matmul_efficiency});
    engine_ = make_engine(r.engine.empty() ? r.cluster.engine : r.engine, options);
    precision_ = r.precision.empty() ? r.cluster.precision : r.precision;
    peak_ = r.cluster.peak_flops(precision_);
    rate_ = peak_ * r.cluster.matmul_efficiency;
    mem_bw_ = r.cluster.memory_bandwidth_gbs * 1e9;
    overlap_ = r.dp_overlap.value_or(r.cluster.dp_overlap);
    TESSERA_CHECK_AS(ConfigError, overlap_ >= 0 && overlap_ <= 1,
                     "--dp-overlap is a fraction between 0 and 1, got ", overlap_);
  }

  const Engine& engine() const { return *engine_; }

  // Memory of every rank, and the step: simulated, estimated (layouts that fit), or not at all.
  Prediction evaluate(Layout l, Timing timing) {
    l.zero_shard = resolve_zero_shard(r_.cluster, l);  // "host" on this cluster's nodes
    Prediction p;
    p.layout = l;
    p.problems = layout_problems(l, r_.model, r_.global_batch, engine_->uneven_stages());
    const int world = l.devices(), devices = r_.cluster.devices();
    if (world > devices && !r_.oversubscribe)
      p.problems.push_back(detail::concat("the layout has ", world, " ranks but the cluster '",
                                          r_.cluster.name, "' has ", devices,
                                          " devices (plan for more with --devices, or let CPU "
                                          "ranks share cores with --oversubscribe)"));
    if (!p.ok()) return p;
    share_ = std::max(1, (world + devices - 1) / devices);
    p.capacity = r_.cluster.memory_bytes() / share_;
    const int m = l.micro_batches(r_.global_batch);
    p.micro_batches = m;

    std::vector<StageSheet> sheets;
    for (const parallel::UnitRange& u : engine_->split(r_.model, l))
      sheets.push_back(engine_->stage(r_.model, l, u));
    const parallel::InFlight& flight = cache_.in_flight(l, m);

    // Memory, per pipeline rank.
    for (int rank = 0; rank < l.pp; ++rank) {
      std::vector<StageSheet> chunks;
      std::vector<int> peaks;
      for (int c = 0; c < l.virtual_stages; ++c) {
        const size_t s = static_cast<size_t>(c * l.pp + rank);
        chunks.push_back(sheets[s]);
        peaks.push_back(flight.peak_in_flight[s]);
      }
      const double rank_peak = flight.peak_rank_activations[static_cast<size_t>(rank)];
      MemoryTerms mem = engine_->rank_memory(r_.model, l, chunks, peaks, rank_peak, m);
      mem.reserved = r_.cluster.reserved_gib * 1073741824.0;
      p.in_flight.push_back(rank_peak);
      if (p.rank_memory.empty() || mem.total() > p.memory.total()) {
        p.memory = mem;
        p.memory_rank = rank;
      }
      p.rank_memory.push_back(mem);
      if (rank == 0) p.dp_bytes = engine_->dp_bytes_per_step(l, chunks, m);
    }
    const int ranks_per_node = r_.cluster.devices_per_node * share_;
    p.nodes_spanned = (world + ranks_per_node - 1) / ranks_per_node;
    p.across = cross_node_bytes(l, groups(l, ranks_per_node), sheets, m, engine_->numerics());
    p.fits = p.memory.total() <= p.capacity;
    if (!p.fits) p.why_not = why_not(p);
    if (timing == Timing::Simulate || (timing == Timing::EstimateIfFits && p.fits))
      time(p, sheets, timing == Timing::Simulate);
    return p;
  }

 private:
  // Matmuls at the one efficiency (flops), or at each GEMM's own (cost, when the sheet has them).
  double compute_seconds(bool costed, double flops, double cost, double bytes) const {
    return share_ * ((costed ? cost / peak_ : flops / rate_) + bytes / mem_bw_);
  }

  static std::string why_not(const Prediction& p) {
    const MemoryTerms& m = p.memory;
    std::vector<std::pair<double, std::string>> terms = {
        {m.parameters, "parameters"},           {m.gradients, "gradients"},
        {m.optimizer_state, "optimizer state"}, {m.activations, "activations"},
        {m.buffers, "communication buffers"},   {m.reserved, "runtime reserve"}};
    std::sort(terms.rbegin(), terms.rend());
    std::string s = detail::concat("pipeline rank ", p.memory_rank, " needs ", gib(m.total()),
                                   " per device of ", gib(p.capacity), ": ");
    std::string list;
    for (const auto& [v, name] : terms)
      if (v > 0) list += (list.empty() ? "" : ", ") + name + " " + gib(v);
    s += list;
    if (m.model_states() > p.capacity)
      s += " (the model states alone do not fit: more tp, pp or a higher ZeRO stage)";
    else if (terms.front().second == "activations")
      s += " (activations overflow: recompute, a smaller micro-batch, sp or more tp)";
    return s;
  }

  // Context parallelism's exchanges of stage x per micro-batch: what the forward and the backward
  // (with its recomputation) wait for, and all of it (plan/context_parallel.h). A ring hides
  // behind the attention core's compute on this rank.
  struct CpSeconds {
    double fwd = 0, bwd = 0, comm = 0;
  };
  CpSeconds cp_seconds(const Layout& l, const StageSheet& x) const {
    if (l.cp <= 1 || (x.cp_cores == 0 && x.cp_routers == 0)) return {};
    const ClusterSpec& c = r_.cluster;
    const Group g = cp_group(c, l);
    const double cores = std::max(1, x.cp_cores);
    const bool gc = x.gemm_costed;
    const CpTime t = cp_layer_seconds(
        c, g, x.cp, compute_seconds(gc, x.core_fwd_flops, x.core_fwd_cost, 0) / cores,
        compute_seconds(gc, x.core_bwd_flops, x.core_bwd_cost, 0) / cores);
    const double route = all_gather_seconds(c, g, l.cp * cp_routing_chunk_bytes(r_.model, l));
    CpSeconds s;
    s.fwd = x.cp_cores * t.fwd_exposed + x.cp_routers * route;
    s.bwd = x.cp_cores * t.bwd_exposed + x.cp_core_recomputes * t.fwd_exposed +
            x.cp_router_recomputes * route;
    s.comm = x.cp_cores * (t.fwd_comm + t.bwd_comm) + x.cp_core_recomputes * t.fwd_comm +
             (x.cp_routers + x.cp_router_recomputes) * route;
    return s;
  }

  // Per model stage and micro-batch: the in-line collectives' seconds (in the costs too).
  struct StageComm {
    std::vector<double> tp, ep, cp, cp_exposed;
    explicit StageComm(size_t n) : tp(n), ep(n), cp(n), cp_exposed(n) {}
  };

  // Each model stage's forward, backward and W per micro-batch (compute with the tensor-parallel
  // all-reduces, expert all-to-alls and the context-parallel exchanges' exposed part in line).
  std::vector<parallel::ActionCosts> action_costs(const Layout& l,
                                                  const std::vector<StageSheet>& sheets,
                                                  StageComm& comm) const {
    const ClusterSpec& c = r_.cluster;
    const double t_ar = all_reduce_seconds(c, tp_group(c, l), sheets.front().tp_bytes);
    std::vector<parallel::ActionCosts> costs;
    for (size_t s = 0; s < sheets.size(); ++s) {
      const StageSheet& x = sheets[s];
      const double tp_f = x.tp_fwd * t_ar, tp_b = (x.tp_bwd + x.tp_recompute) * t_ar;
      const double t_a2a = all_to_all_seconds(c, expert_group(c, l), x.a2a_bytes);
      const double ep_f = x.a2a_fwd * t_a2a, ep_b = x.a2a_bwd * t_a2a;
      const CpSeconds cp = cp_seconds(l, x);
      parallel::ActionCosts k;
      const bool g = x.gemm_costed;
      k.forward = std::max(
          1e-12, compute_seconds(g, x.fwd_flops, x.fwd_cost, x.fwd_bytes) + tp_f + ep_f + cp.fwd);
      k.backward = std::max(
          2e-12, compute_seconds(g, x.bwd_flops + x.recompute_flops, x.bwd_cost + x.recompute_cost,
                                 x.bwd_bytes + x.recompute_bytes) +
                     tp_b + ep_b + cp.bwd);
      k.weight = std::min(compute_seconds(g, x.wgrad_flops, x.wgrad_cost, 0), 0.5 * k.backward);
      costs.push_back(k);
      comm.tp[s] = tp_f + tp_b;
      comm.ep[s] = ep_f + ep_b;
      comm.cp[s] = cp.comm;
      comm.cp_exposed[s] = cp.fwd + cp.bwd;
    }
    return costs;
  }

  // Bytes per step of pipeline rank 0: tensor-parallel, point to point, context- and
  // expert-parallel.
  void rank0_bytes(Prediction& p, const std::vector<StageSheet>& sheets) const {
    const Layout& l = p.layout;
    const int m = p.micro_batches, pp = l.pp, v = l.virtual_stages;
    double tp_bytes = 0, p2p = 0, cp = 0, ep = 0;
    const int last = pp * v - 1;
    for (int ch = 0; ch < v; ++ch) {
      const size_t s = static_cast<size_t>(ch * pp);
      const StageSheet& x = sheets[s];
      if (l.tp > 1)
        tp_bytes += m * (x.tp_fwd + x.tp_bwd + x.tp_recompute) * x.tp_bytes * 2 * (l.tp - 1) / l.tp;
      if (static_cast<int>(s) != last) p2p += m * x.boundary_bytes;
      if (s != 0) p2p += m * x.boundary_bytes;
      cp += m * x.cp_bytes(r_.model, l);
      if (l.ep > 1) ep += m * (x.a2a_fwd + x.a2a_bwd) * x.a2a_bytes * (l.ep - 1) / l.ep;
    }
    p.tp_bytes = tp_bytes;
    p.cp_bytes = cp;
    p.ep_bytes = ep;
    p.p2p_bytes = pp > 1 ? p2p : 0;
  }

  // A rank's data-parallel communication after its last backward (rt.dp_comm) and what of it is
  // not hidden behind the backward (rt.dp_exposed): `fwd` and `bwd` its seconds per micro-batch.
  void add_dp_comm(RankTime& rt, const Layout& l, int m, double dense, double expert, double tied,
                   double fwd, double bwd) const {
    const ClusterSpec& c = r_.cluster;
    const Numerics n = engine_->numerics();
    // The gradient groups: dp x cp, and the experts' holders x cp.
    // HSDP: the dense set's ZeRO shard group; the reduced shards are all-reduced over their
    // replicas once, after the backward (data_parallel.cc): exposed.
    const Group gd = zero_shard_group(c, l), ge = expert_gradient_group(c, l);
    const Group gr = zero_replica_group(c, l);
    const double replicas =
        parallel::traits(l.zero).sharded() && gr.size > 1
            ? all_reduce_seconds(c, gr, n.replica_comm * dense / l.shard_ranks())
            : 0;
    auto rs = [&]() {
      return reduce_scatter_seconds(c, gd, n.comm * dense) +
             reduce_scatter_seconds(c, ge, n.comm * expert);
    };
    auto ag = [&]() {
      return all_gather_seconds(c, gd, n.comm * dense) + all_gather_seconds(c, ge, n.comm * expert);
    };
    const parallel::ZeroTraits z = parallel::traits(l.zero);
    if (!z.sharded()) {  // one all-reduce (a reduce-scatter and an all-gather) of the last
      rt.dp_comm = 2 * rs();
      rt.dp_exposed = exposed(rt.dp_comm, bwd, overlap_);
    } else if (!z.reduces_every_micro_batch) {  // reduce-scatter, then the parameters gathered
      rt.dp_comm = 2 * rs();
      rt.dp_exposed = exposed(rs(), bwd, overlap_) + ag();
    } else if (!z.shards_parameters) {  // a reduce-scatter per micro-batch
      rt.dp_comm = m * rs() + ag();
      rt.dp_exposed = m * exposed(rs(), bwd, overlap_) + ag();
    } else {  // and the parameters gathered for each forward and backward
      rt.dp_comm = m * (rs() + 2 * ag());
      rt.dp_exposed = m * (exposed(rs() + ag(), bwd, overlap_) + exposed(ag(), fwd, overlap_));
    }
    rt.dp_comm += replicas;
    rt.dp_exposed += replicas;
    if (tied > 0) {
      const double t_emb = all_reduce_seconds(c, embedding_group(c, l), n.comm * tied);
      rt.dp_comm += t_emb;
      rt.dp_exposed += t_emb;
    }
  }

  void time(Prediction& p, const std::vector<StageSheet>& sheets, bool simulate) {
    const Layout& l = p.layout;
    const ClusterSpec& c = r_.cluster;
    const int m = p.micro_batches, pp = l.pp, v = l.virtual_stages;

    StageComm comm(sheets.size());
    const std::vector<parallel::ActionCosts> costs = action_costs(l, sheets, comm);
    const double boundary = sheets.front().boundary_bytes;
    p.p2p_seconds = pp > 1 ? p2p_seconds(c, pipeline_neighbours_share_node(c, l), boundary) : 0;

    // Per rank: its chunks' work per micro-batch.
    std::vector<double> fwd(pp, 0), bwd(pp, 0), weight(pp, 0);
    for (int rank = 0; rank < pp; ++rank)
      for (int ch = 0; ch < v; ++ch) {
        const parallel::ActionCosts& k = costs[static_cast<size_t>(ch * pp + rank)];
        fwd[rank] += k.forward;
        bwd[rank] += k.backward;
        weight[rank] += k.weight;
      }
    std::vector<double> end(pp, 0);
    double makespan = 0;
    if (simulate) {
      const parallel::Schedule& sched = cache_.schedule(l, m);
      const parallel::Simulation sim = parallel::simulate(sched, costs, p.p2p_seconds);
      TESSERA_ASSERT(sim.deadlock.stuck.empty(), "the ", sched.name, " schedule deadlocked");
      for (int rank = 0; rank < pp; ++rank)
        for (const parallel::TimedAction& a : sim.ranks[static_cast<size_t>(rank)])
          if (parallel::is_compute(a.action.kind)) end[rank] = std::max(end[rank], a.end);
      makespan = sim.makespan;
      p.bubble = sim.bubble_overall;
      p.simulated = true;
    } else {
      makespan = estimated_makespan(l, m, fwd, bwd, weight, p.p2p_seconds);
      std::fill(end.begin(), end.end(), makespan);
      double busy = 0;
      for (int rank = 0; rank < pp; ++rank) busy += m * (fwd[rank] + bwd[rank]);
      p.bubble = makespan > 0 ? std::max(0.0, 1 - busy / (pp * makespan)) : 0;
    }

    // What follows each rank's last backward.
    const Numerics n = engine_->numerics();
    p.rank_time.assign(pp, RankTime{});
    double step = 0;
    for (int rank = 0; rank < pp; ++rank) {
      RankTime& rt = p.rank_time[rank];
      double dense = 0, expert = 0, tied = 0;
      for (int ch = 0; ch < v; ++ch) {
        const size_t s = static_cast<size_t>(ch * pp + rank);
        dense += sheets[s].dense_elems;
        expert += sheets[s].expert_elems;
        tied += sheets[s].tied_wte_elems;
        rt.tp_comm += m * comm.tp[s];
        rt.ep_comm += m * comm.ep[s];
        rt.cp_comm += m * comm.cp[s];
        rt.cp_exposed += m * comm.cp_exposed[s];
      }
      rt.compute = m * (fwd[rank] + bwd[rank]);
      rt.end_of_backward = end[rank];
      add_dp_comm(rt, l, m, dense, expert, tied, fwd[rank], bwd[rank]);
      const bool sharded_state = parallel::traits(l.zero).shards_optimizer_state;
      const double updated = (sharded_state ? dense / l.shard_ranks() : dense) +
                             (sharded_state ? expert / l.expert_gradient_ranks() : expert);
      rt.optimizer = share_ * n.optimizer_traffic * updated / mem_bw_;
      const double done = rt.end_of_backward + rt.dp_exposed + rt.optimizer;
      if (done > step) {
        step = done;
        p.critical_rank = rank;
      }
    }
    p.step_seconds = step;

    // Throughput and utilisation.
    const double tokens = static_cast<double>(r_.global_batch) * r_.model.seq;
    p.tokens_per_second = tokens / step;
    double hw = 0;
    for (const StageSheet& x : sheets) hw += x.fwd_flops + x.bwd_flops + x.recompute_flops;
    p.hardware_flops_per_step = hw * l.tp * l.cp * l.dp * m;
    p.model_flops_per_step = r_.model.model_flops_per_token() * tokens;
    const double devices = std::min(l.devices(), c.devices());
    p.mfu = p.model_flops_per_step / (step * devices * peak_);
    p.hfu = p.hardware_flops_per_step / (step * devices * peak_);
    p.tflops_per_device = p.hardware_flops_per_step / (step * l.devices()) / 1e12;

    rank0_bytes(p, sheets);
  }

  // The step's compute phase without the simulator: the slowest rank's work for every
  // micro-batch plus the fill and drain of the pipeline (the closed-form bubbles of
  // docs/ARCHITECTURE.md with the ranks' own costs), and two transfers per stage boundary.
  static double estimated_makespan(const Layout& l, int m, const std::vector<double>& fwd,
                                   const std::vector<double>& bwd, const std::vector<double>& w,
                                   double p2p) {
    const int p = l.pp;
    double slowest = 0, sum = 0, zb_idle = 0;
    for (int r = 0; r < p; ++r) {
      slowest = std::max(slowest, fwd[r] + bwd[r]);
      sum += fwd[r] + bwd[r];
      zb_idle += fwd[r] + bwd[r] - 2 * w[r];
    }
    if (p == 1) return m * slowest;
    const double fill_p2p = 2 * (p - 1) * p2p;
    const double mean = sum / p;
    const parallel::ScheduleTraits& t = parallel::traits(l.schedule);
    if (t.interleaved)
      return m * slowest + (p - 1) * mean / l.virtual_stages + l.virtual_stages * fill_p2p;
    if (t.splits_backward) return m * slowest + (p - 1) * zb_idle / p + fill_p2p;
    return (m - 1) * slowest + sum + fill_p2p;  // gpipe, 1f1b
  }

  // How l's communicators fall on the nodes, worked out once per shape (a ranking plans many
  // layouts of one shape).
  const LayoutGroups& groups(const Layout& l, int ranks_per_node) {
    const std::array<int, 7> key = {l.dp, l.tp, l.pp, l.cp, l.ep, l.shard_ranks(), ranks_per_node};
    auto it = groups_.find(key);
    if (it == groups_.end()) it = groups_.emplace(key, layout_groups(l, ranks_per_node)).first;
    return it->second;
  }

  const PlanRequest& r_;
  std::map<std::array<int, 7>, LayoutGroups> groups_;
  std::unique_ptr<Engine> engine_;
  std::string precision_;
  double peak_ = 0, rate_ = 0, mem_bw_ = 0, overlap_ = 0;
  int share_ = 1;
  ScheduleCache cache_;
};

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

template <typename T>
std::vector<T> choices(const std::optional<T>& fixed, std::vector<T> all) {
  if (fixed) return {*fixed};
  return all;
}

// The parallel degrees of a ranking's layouts (and cp's variant), tensor parallelism first.
struct Degrees {
  int tp = 1, cp = 1, pp = 1, dp = 1;
  nn::CpComm cp_comm = nn::CpComm::AllGather;
};

std::vector<Degrees> degrees_of(const PlanRequest& r, int devices, const LayoutSpace& space) {
  std::vector<int> cps = {1};  // context parallelism only when asked (LayoutSpace)
  if (space.cp)
    cps = {*space.cp};
  else
    for (int cp : divisors(devices))
      if (cp > 1 && cp <= space.max_cp) cps.push_back(cp);
  std::vector<Degrees> out;
  for (int tp : choices(space.tp, divisors(devices))) {
    if (space.tp_within_node && !space.tp && tp > r.cluster.devices_per_node) continue;
    for (int cp : cps) {
      if (cp < 1 || devices % (tp * cp) != 0) continue;
      const std::vector<nn::CpComm> comms =
          cp > 1 && !space.cp_comm
              ? std::vector<nn::CpComm>{nn::CpComm::AllGather, nn::CpComm::Ring,
                                        nn::CpComm::Ulysses}
              : std::vector<nn::CpComm>{space.cp_comm.value_or(nn::CpComm::AllGather)};
      for (int pp : choices(space.pp, divisors(devices / (tp * cp)))) {
        if (devices % (tp * cp * pp) != 0) continue;
        const int dp = devices / (tp * cp * pp);
        if (space.dp && *space.dp != dp) continue;
        for (nn::CpComm c : comms) out.push_back({tp, cp, pp, dp, c});
      }
    }
  }
  return out;
}

}  // namespace

Prediction plan_layout(const PlanRequest& r, const Layout& l) {
  Evaluator e(r);
  return e.evaluate(l, Timing::Simulate);
}

Ranking rank_layouts(const PlanRequest& r, int devices, const LayoutSpace& space,
                     int simulate_top) {
  Evaluator e(r);
  Ranking out;
  out.devices = devices;
  const ModelSpec& m = r.model;
  for (const Degrees& d : degrees_of(r, devices, space)) {
    const int tp = d.tp, pp = d.pp, dp = d.dp;
    std::vector<int> eps = {1};
    if (m.moe.enabled()) eps = divisors(dp);
    for (int ep : choices(space.ep, eps))
      for (parallel::ZeroStage zero :
           choices(space.zero,
                   dp > 1 ? std::vector<parallel::ZeroStage>{parallel::ZeroStage::None,
                                                             parallel::ZeroStage::OptimizerState,
                                                             parallel::ZeroStage::Gradients,
                                                             parallel::ZeroStage::Parameters}
                          : std::vector<parallel::ZeroStage>{parallel::ZeroStage::None}))
        for (bool sp :
             choices(space.sp, tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}))
          for (int mb : choices(space.micro_batch, space.micro_batch_sizes))
            for (nn::Recompute rc :
                 choices(space.recompute,
                         {nn::Recompute::None, nn::Recompute::Selective, nn::Recompute::Full})) {
              std::vector<std::pair<parallel::ScheduleKind, int>> schedules;
              if (pp == 1) {
                schedules.push_back({parallel::ScheduleKind::OneFOneB, 1});
              } else {
                for (parallel::ScheduleKind s : parallel::pipeline_schedules()) {
                  if (space.schedule && *space.schedule != s) continue;
                  if (!parallel::traits(s).interleaved) {
                    if (!space.virtual_stages || *space.virtual_stages == 1)
                      schedules.push_back({s, 1});
                    continue;
                  }
                  for (int vs = 2; vs <= space.max_virtual_stages; ++vs)
                    if (!space.virtual_stages || *space.virtual_stages == vs)
                      schedules.push_back({s, vs});
                }
              }
              for (const auto& [sched, vs] : schedules) {
                Layout l;
                l.dp = dp;
                l.tp = tp;
                l.pp = pp;
                l.cp = d.cp;
                l.cp_comm = d.cp_comm;
                l.ep = ep;
                l.zero = zero;
                l.zero_shard = space.zero_shard.value_or(0);
                l.sp = sp;
                l.schedule = sched;
                l.virtual_stages = vs;
                l.micro_batch = mb;
                l.recompute = rc;
                Prediction p = e.evaluate(l, Timing::EstimateIfFits);
                if (!p.ok()) {
                  ++out.skipped;
                  continue;
                }
                ++out.considered;
                (p.fits ? out.fitting : out.not_fitting).push_back(std::move(p));
              }
            }
  }
  auto faster = [](const Prediction& a, const Prediction& b) {
    return a.step_seconds < b.step_seconds;
  };
  std::sort(out.fitting.begin(), out.fitting.end(), faster);
  const size_t top = std::min(out.fitting.size(), static_cast<size_t>(std::max(0, simulate_top)));
  for (size_t i = 0; i < top; ++i)
    out.fitting[i] = e.evaluate(out.fitting[i].layout, Timing::Simulate);
  out.simulated = static_cast<int>(top);
  std::sort(out.fitting.begin(), out.fitting.begin() + static_cast<long>(top), faster);
  std::sort(
      out.not_fitting.begin(), out.not_fitting.end(),
      [](const Prediction& a, const Prediction& b) { return a.memory.total() < b.memory.total(); });
  return out;
}

}  // namespace tessera::plan
