// RankRun's reports: the header, the per-step metrics and progress line, memory, the pipeline's
// bubbles and the timeline.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "tessera/io/atomic_file.h"
#include "tessera/nn/gpt_costs.h"
#include "tessera/parallel/gather.h"
#include "tessera/train/hosts.h"
#include "tessera/train/moe_stats.h"
#include "tessera/train/rank_run.h"

namespace tessera::train {

namespace {

const char* dtype_label(DType t) {
  return t == DType::BF16 ? "bf16" : "fp32";
}

size_t model_state_peak(const Allocator& a) {
  return a.peak(MemCategory::Parameters) + a.peak(MemCategory::Gradients) +
         a.peak(MemCategory::OptimizerState);
}

std::string moe_line(const nn::GPTConfig& m, const TrainConfig& cfg) {
  const nn::MoeConfig& moe = m.moe;
  std::string kind = "GPT-2 MLPs";
  if (m.llama()) {
    kind = "SwiGLU experts " + std::to_string(m.moe_hidden()) + " wide";
    if (moe.shared_ffn_dim > 0)
      kind += std::string(moe.shared_gate ? ", a gated" : ", a") + " shared expert " +
              std::to_string(moe.shared_ffn_dim) + " wide";
  }
  char bias[80] = "";
  if (cfg.moe_bias_rate > 0)
    std::snprintf(bias, sizeof bias, ", selection bias rate %g (aux-loss-free balancing)",
                  static_cast<double>(cfg.moe_bias_rate));
  char line[640];
  std::snprintf(
      line, sizeof line,
      "mixture of experts: %d experts (%s), top-%d %s%s, every %d block(s) (blocks l "
      "with l %% %d == %d%s), capacity factor %g%s, aux loss %g, z loss %g%s | ep %d (%d "
      "experts per rank, expert gradients summed over %d ranks)",
      moe.experts, kind.c_str(), moe.top_k, nn::to_string(moe.score),
      moe.renormalize ? " renormalised" : "", moe.every, moe.every, moe.every - 1,
      moe.dense_layers.empty() ? "" : ", some dense", static_cast<double>(moe.capacity_factor),
      moe.capacity_factor > 0 ? "" : " (dropless)", static_cast<double>(moe.aux_loss),
      static_cast<double>(moe.z_loss), bias, cfg.ep, moe.experts / cfg.ep, cfg.dp / cfg.ep);
  return line;
}

}  // namespace

void RankRun::print_header() {
  if (!log_) return;  // the lead rank prints
  const nn::GPTConfig& m = plan_.mcfg;
  char line[800];
  // Context parallelism: the ranks per sequence, how they meet, the rows each holds.
  const std::string cp = cfg_.cp > 1
                             ? detail::concat(" | cp ", cfg_.cp, " (", nn::to_string(cfg_.cp_comm),
                                              ", ", local_seq_, " rows of each sequence)")
                             : std::string();
  // The Llama family: its model type, key/value heads, MLP width and head.
  char family[160] = "GPT-2";
  if (m.llama())
    std::snprintf(family, sizeof family, "%s (kv heads %d, ffn %d, rope theta %g%s, %s head)",
                  m.hf_model_type.empty() ? "Llama" : m.hf_model_type.c_str(), m.kv_heads(),
                  m.mlp_hidden(), m.rope_theta, m.rope_scaling.factor > 0 ? " llama3-scaled" : "",
                  m.tie_embeddings ? "tied" : "untied");
  std::snprintf(
      line, sizeof line,
      "model: %s L=%d C=%d heads=%d context=%d vocab=%d, %.2fM parameters | batch %d x "
      "%d tokens = dp %d x %d micro-batches x %d | tp %d%s%s | pp %d | zero %d | recompute %s | %s "
      "backend, %d thread(s) per rank | train %lld tokens, val %lld | unigram entropy %.3f nats",
      family, m.n_layer, m.n_embd, m.n_head, m.block_size, m.vocab_size,
      static_cast<double>(nn::total_params(m)) / 1e6, cfg_.batch, cfg_.seq, cfg_.dp, n_micro_,
      micro_, cfg_.tp, cfg_.sp ? " sp" : "", cp.c_str(), cfg_.pp, cfg_.zero,
      nn::to_string(cfg_.recompute), std::string(world_.backend()).c_str(), plan_.threads,
      static_cast<long long>(plan_.split.train.size()),
      static_cast<long long>(plan_.split.validation.size()), plan_.unigram_entropy);
  say(log_, nullptr, line);
  say(log_, nullptr, precision_line());
  if (m.moe.enabled()) say(log_, nullptr, moe_line(m, cfg_));
  if (const int S = mesh_.shape().zero_shard; S > 0)
    say(log_, nullptr,
        detail::concat("hybrid sharding (HSDP, ", config_key("zero_shard_group"), " ",
                       cfg_.zero_shard_group, "): ZeRO ", cfg_.zero, " shards over ", S,
                       " ranks, replicated ", cfg_.dp * cfg_.cp / S,
                       " times; each shard's gradients all-reduced over its replicas"));
  for (const std::string& p : placement_problems(mesh_.shape(), hosts_))
    say(log_, nullptr,
        "placement: " + p +
            ": their collectives cross the network in every layer; give each host consecutive "
            "ranks (mpirun's default, --map-by slot) so that tp, cp and ep stay inside a host");
  if (parallel::traits(schedule_.kind).pipelined)
    say(log_, nullptr,
        "pipeline: " + schedule_.name + " schedule, " + std::to_string(cfg_.pp) + " stages x " +
            std::to_string(cfg_.virtual_stages) + " chunk(s), units per stage " +
            parallel::to_string(split_) + " (0 = embedding, " + std::to_string(m.n_layer + 1) +
            " = head; (attn) / (mlp): a block's half)");
  if (plan_.ckpt)
    say(log_, nullptr,
        "resumed from " + plan_.ckpt->dir.string() + " at step " + std::to_string(step_));
}

std::string RankRun::precision_line() const {
  const nn::GPTLayout& layout = first_model().layout();
  if (device_)
    return "device: " + device_->describe() +
           "; fp32 master weights, gradients and optimizer state" +
           (peak_flops_ > 0 ? "; MFU against " + format_rate(peak_flops_) +
                                  "FLOP/s per GPU (the device's dense bf16 peak) x " +
                                  detail::concat(devices_in_use_) + " GPU(s)"
                            : std::string());
  const bool gathers = parallel::traits(dpo_.zero).shards_parameters;
  const bool sends_activations = cfg_.tp > 1 || cfg_.pp > 1;
  return std::string("precision: ") + kernels::to_string(layout.gemm.precision) + ", " +
         kernels::describe(layout.gemm, cfg_.bf16_gemm, plan_.bf16_gemm_chosen_by) +
         "; fp32 master weights, gradients and optimizer state; gradients reduced in " +
         dtype_label(cfg_.grad_reduce_dtype) +
         (gathers ? std::string(", parameters gathered in ") + dtype_label(dpo_.param_gather_dtype)
                  : std::string()) +
         (sends_activations
              ? std::string(", activations sent in ") + dtype_label(layout.activation_wire)
              : std::string()) +
         (peak_flops_ > 0
              ? "; MFU against " + format_rate(peak_flops_) + "FLOP/s per rank (" +
                    plan_.peak_source + ") x " + std::to_string(world_.size()) + " ranks"
              : std::string());
}

std::pair<int, double> RankRun::slowest_rank() const {
  const size_t n = step_compute_.size();
  if (n < 2 || compute_history_.empty()) return {-1, 0};
  std::vector<double> mean(n, 0.0);
  for (const auto& step : compute_history_)
    for (size_t r = 0; r < n; ++r)
      mean[r] += step[r] / static_cast<double>(compute_history_.size());
  const size_t worst =
      static_cast<size_t>(std::max_element(mean.begin(), mean.end()) - mean.begin());
  std::vector<double> others;
  for (size_t r = 0; r < n; ++r)
    if (r != worst) others.push_back(mean[r]);
  std::sort(others.begin(), others.end());
  const size_t m = others.size();
  const double median = m % 2 ? others[m / 2] : 0.5 * (others[m / 2 - 1] + others[m / 2]);
  // Clearly above: more than 1.25x, and by more than a millisecond (timer noise on tiny steps).
  if (mean[worst] > 1.25 * median && mean[worst] - median > 1e-3)
    return {static_cast<int>(worst), median > 0 ? mean[worst] / median : 0};
  return {-1, 0};
}

void RankRun::dump_error(const std::exception_ptr& e) noexcept {
  if (!recorder_) return;
  try {
    std::rethrow_exception(e);
  } catch (const comm::InjectedExit&) {  // its dump says it exited
  } catch (const std::exception& x) {
    recorder_->dump("error", x.what());
  } catch (...) {
    recorder_->dump("error", "unknown error");
  }
}

void RankRun::after_step(double loss, double norm, float lr, double secs, double cpu_secs,
                         const MoeStepStats& moe) {
  exchange_step_times(secs);  // collective
  step_times_.push_back(secs);
  result_.losses.push_back(loss);
  const double comm_bytes = traffic_.data_parallel + traffic_.tensor_parallel;
  result_.comm_bytes_per_step = comm_bytes;
  result_.tp_bytes_per_step = traffic_.tensor_parallel;
  result_.pp_bytes_per_step = traffic_.pipeline;
  result_.ep_bytes_per_step = traffic_.expert_parallel;
  result_.cp_bytes_per_step = traffic_.context_parallel;
  StepStats st;
  st.step = step_ + 1;
  st.total_steps = cfg_.steps;
  st.loss = loss;
  st.lr = lr;
  st.grad_norm = norm;
  st.step_seconds = secs;
  st.tokens_per_s = tokens_per_step_ / secs;
  st.flops_per_s = first_model().flops_per_token(cfg_.seq) * tokens_per_step_ / secs;
  if (peak_flops_ > 0)
    st.mfu = st.flops_per_s / (peak_flops_ * (device_ ? devices_in_use_ : world_.size()));
  double mean = 0;
  const size_t recent = std::min<size_t>(step_times_.size(), 20);
  for (size_t i = step_times_.size() - recent; i < step_times_.size(); ++i) mean += step_times_[i];
  st.eta_seconds = mean / recent * static_cast<double>(cfg_.steps - step_ - 1);
  nlohmann::json record{{"step", st.step},
                        {"loss", loss},
                        {"lr", lr},
                        {"grad_norm", norm},
                        {"tokens_per_s", st.tokens_per_s},
                        {"flops_per_s", st.flops_per_s},
                        {"mfu", st.mfu},
                        {"step_ms", secs * 1e3},
                        {"process_cpu_ms", cpu_secs * 1e3},
                        {"comm_bytes_per_rank", comm_bytes},
                        {"tp_bytes_per_rank", traffic_.tensor_parallel},
                        {"pp_bytes_per_rank", traffic_.pipeline}};
  if (!moe.layers.empty()) {
    st.moe = true;
    st.moe_aux_loss = moe.aux_loss;
    st.moe_z_loss = moe.z_loss;
    st.moe_max_load_ratio = moe.max_load_ratio;
    st.moe_dropped_fraction = moe.dropped_fraction;
    st.moe_load = moe.mean_load;
    nlohmann::json load = nlohmann::json::object(), balance = nlohmann::json::object();
    for (const MoeStepStats::Layer& l : moe.layers) {
      load["h." + std::to_string(l.layer)] = l.load;
      balance["h." + std::to_string(l.layer)] = l.balance;
    }
    record["moe_aux_loss"] = moe.aux_loss;
    record["moe_z_loss"] = moe.z_loss;
    record["moe_balance"] = balance;
    record["moe_load"] = load;
    record["moe_max_load_ratio"] = moe.max_load_ratio;
    record["moe_dropped_fraction"] = moe.dropped_fraction;
    record["ep_bytes_per_rank"] = traffic_.expert_parallel;
  }
  if (cfg_.cp > 1) record["cp_bytes_per_rank"] = traffic_.context_parallel;
  if (mesh_.zero_replica_group()) record["zero_replica_bytes_per_rank"] = traffic_.zero_replicas;
  // Stragglers: every rank's compute and communication-wait milliseconds, by world rank.
  std::vector<double> compute_ms, wait_ms;
  for (double c : step_compute_) compute_ms.push_back(c * 1e3);
  for (double w : step_wait_ranks_) wait_ms.push_back(w * 1e3);
  record["compute_ms"] = compute_ms;
  record["wait_ms"] = wait_ms;
  const auto [slow, ratio] = slowest_rank();
  if (slow >= 0) {
    record["slowest_rank"] = slow;
    record["slowest_ratio"] = ratio;
  }
  st.compute_ms = std::move(compute_ms);
  st.wait_ms = std::move(wait_ms);
  st.slowest_rank = slow;
  st.slowest_ratio = ratio;
  metrics_->write(record);
  if (lead_ && plan_.on_step) plan_.on_step(record);
  if (pl_) pl_->update(st);
}

void RankRun::report_memory() {
  // Every rank's memory peaks, reported by rank 0.
  result_.memory_reports = parallel::all_gather_strings(world_, alloc_.report());
  const int64_t peak = static_cast<int64_t>(model_state_peak(alloc_));
  std::vector<int64_t> peaks(world_.size());
  world_.all_gather(&peak, peaks.data(), 1, DType::I64).wait();
  result_.model_state_peaks.assign(peaks.begin(), peaks.end());
  const int64_t total = static_cast<int64_t>(alloc_.peak());
  world_.all_gather(&total, peaks.data(), 1, DType::I64).wait();
  result_.memory_peaks.assign(peaks.begin(), peaks.end());
  for (const std::string& r : result_.memory_reports) say(log_, nullptr, "memory: " + r);
  if (device_) {
    const int64_t dev = static_cast<int64_t>(device_->peak_bytes());
    world_.all_gather(&dev, peaks.data(), 1, DType::I64).wait();
    std::string line = "device memory peaks (GiB):";
    for (int64_t p : peaks)
      line += detail::concat(" ", static_cast<double>(p) / (1024.0 * 1024 * 1024));
    say(log_, nullptr, line);
  }
}

void RankRun::report_pipeline() {
  int in_flight = 0;
  for (size_t c = 0; c < chunks_.size(); ++c)
    in_flight += executor_->records_allocated(static_cast<int>(c));
  std::vector<int64_t> flights(world_.size());
  const int64_t mine = in_flight;
  world_.all_gather(&mine, flights.data(), 1, DType::I64).wait();
  result_.peak_micro_batches_in_flight.assign(flights.begin(), flights.end());
  std::vector<double> bubbles(world_.size());
  const double bubble = timing_sum_.bubble();
  world_.all_gather(&bubble, bubbles.data(), 1, DType::F64).wait();
  result_.measured_bubble = bubbles;
  if (!parallel::traits(schedule_.kind).pipelined || !log_) return;
  // The first step allocates and is not timed: with one step there is no measurement.
  const bool measured = timing_sum_.pipeline_seconds > 0;
  std::string line = measured ? "pipeline: measured bubble per stage"
                              : "pipeline: bubble not measured (the first step is not timed; "
                                "run 2 or more steps)";
  char buf[96];
  for (int r = 0; r < cfg_.pp; ++r) {
    const int w = parallel::Mesh::world_rank(mesh_.shape(), 0, r, 0);
    const long long flight = flights[static_cast<size_t>(w)];
    const char* noun = flight == 1 ? "micro-batch" : "micro-batches";
    if (measured)
      std::snprintf(buf, sizeof buf, " | %d: %.1f%% (%lld %s in flight)", r,
                    100 * bubbles[static_cast<size_t>(w)], flight, noun);
    else
      std::snprintf(buf, sizeof buf, " | %d: %lld %s in flight", r, flight, noun);
    line += buf;
  }
  say(log_, nullptr, line);
}

void RankRun::write_timeline() {
  if (!tracer_) return;
  nlohmann::json j = nlohmann::json::array();
  for (const TraceEvent& e : with_idle_spans(tracer_->events()))
    j.push_back({e.name, e.category, e.track, e.start_us, e.dur_us});
  const std::vector<std::string> all = parallel::all_gather_strings(world_, j.dump());
  if (!lead_) return;
  std::vector<std::pair<int, std::vector<TraceEvent>>> ranks;
  for (size_t r = 0; r < all.size(); ++r) {
    std::vector<TraceEvent> ev;
    for (const auto& e : nlohmann::json::parse(all[r]))
      ev.push_back(TraceEvent{e[0], e[1], e[2], e[3], e[4]});
    ranks.emplace_back(static_cast<int>(r), std::move(ev));
  }
  io::write_file_atomic(cfg_.trace, chrome_trace_json(ranks));
  say(log_, nullptr, "timeline written to " + cfg_.trace + " (open in ui.perfetto.dev)");
}

}  // namespace tessera::train
