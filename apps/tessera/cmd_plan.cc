// `tessera plan`: predict what a layout costs (memory per device, step time, tokens/s, MFU) before
// launching it, or rank every layout of a device count; `--calibrate` measures this machine into
// a cluster description (docs/PLANNER.md).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "commands.h"
#include "tessera/comm/launch.h"
#include "tessera/core/error.h"
#include "tessera/io/atomic_file.h"
#include "tessera/plan/calibrate.h"
#include "tessera/plan/planner.h"
#include "tessera/plan/report.h"
#include "tessera/train/plan_of.h"
#include "tessera/train/train_config.h"

namespace tessera::app {
namespace {

struct PlanFlags {
  std::string config, model_file, cluster = "dev-vm", engine, precision, link = "inproc";
  std::string json, schedule, recompute, out;
  int layers = 4, dim = 192, heads = 0, seq = 128, vocab = 512, context = 0, batch = 16;
  double dropout = 0;
  int moe_experts = 0, moe_top_k = 2, moe_every = 1;
  double moe_capacity_factor = 0, moe_skew = 1;
  std::string arch = "gpt2";
  int kv_heads = 0, ffn_dim = 0;
  bool tie_embeddings = true, qkv_bias = false;
  int dp = 1, tp = 1, pp = 1, ep = 1, zero = 0, virtual_stages = 1, micro_batch = 0;
  int cp = 1, max_cp = 1;
  std::string cp_comm = "allgather";
  std::string zero_shard_group = "all";
  bool sp = false;
  int devices = 0, top = 20, simulate_top = 32, calibrate_ranks = 2;
  double bucket_mb = 25, dp_overlap = -1;
  std::string optimizer = "adamw";
  bool rank = false, oversubscribe = false, calibrate = false, quick = false;
  std::map<std::string, CLI::Option*> given;
  bool has(const std::string& k) const {
    auto it = given.find(k);
    return it != given.end() && it->second->count() > 0;
  }
};

void write_json(const std::string& path, const nlohmann::json& j) {
  if (path == "-") {
    std::cout << j.dump(2) << "\n";
    return;
  }
  io::write_file_atomic(path, j.dump(2) + "\n");
}

void run_calibrate(const PlanFlags& f) {
  const comm::Backend b = comm::resolve_backend(comm::Backend::Auto);
  if (b == comm::Backend::Mpi) {  // add the MPI backend's link to an existing description
    std::unique_ptr<comm::Communicator> world = comm::mpi_world();
    if (world->rank() == 0) {  // before the measurement, which takes a while
      TESSERA_CHECK_AS(ConfigError, !f.out.empty(),
                       "under mpirun, --calibrate adds the MPI measurement to an existing file: "
                       "give it with --out FILE");
      TESSERA_CHECK_AS(ConfigError, std::filesystem::is_regular_file(f.out),
                       "under mpirun, --calibrate adds the MPI measurement to an existing "
                       "description, and '",
                       f.out,
                       "' is not a file: first run `tessera plan "
                       "--calibrate --out ",
                       f.out, "` without mpirun");
    }
    nlohmann::json link =
        plan::calibrate_link(*world, f.quick, world->rank() == 0 ? &std::cout : nullptr);
    if (world->rank() != 0) return;
    plan::ClusterSpec c = plan::load_cluster(f.out);
    c.calibration["mpi"] = link;
    write_json(f.out, plan::to_json(c));
    std::printf("added calibration.mpi (%.3g GB/s, %.3g us) to %s\n",
                link.at("bandwidth_gbs").get<double>(), link.at("latency_us").get<double>(),
                f.out.c_str());
    return;
  }
  plan::CalibrationOptions o;
  o.ranks = f.calibrate_ranks;
  o.quick = f.quick;
  plan::ClusterSpec c = plan::calibrate_this_machine(o, &std::cout);
  if (!f.out.empty() && f.out != "-") {
    c.name = std::filesystem::path(f.out).stem().string();  // --cluster finds it by that name
    // Keep an existing MPI measurement.
    std::ifstream in(f.out);
    if (in.good()) {
      try {
        nlohmann::json old = nlohmann::json::parse(in);
        if (old.contains("calibration") && old["calibration"].contains("mpi"))
          c.calibration["mpi"] = old["calibration"]["mpi"];
      } catch (const nlohmann::json::exception&) {
      }
    }
  }
  write_json(f.out.empty() ? "-" : f.out, plan::to_json(c));
  if (!f.out.empty() && f.out != "-") std::printf("wrote %s\n", f.out.c_str());
}

void run(PlanFlags& f, int& exit_code) {
  if (f.calibrate) {
    run_calibrate(f);
    exit_code = 0;
    return;
  }
  plan::PlanRequest r;
  plan::Layout layout;
  // A train --config file first, then the flags given on the command line.
  if (!f.config.empty()) {
    const train::TrainConfig tc = train::train_config_from_json(train::read_json_file(f.config));
    r.model = plan::model_of(tc);
    layout = plan::layout_of(tc);
    r.engine_options = plan::engine_options_of(tc);
    r.global_batch = tc.batch;
  } else {
    r.model.layers = f.layers;
    r.model.hidden = f.dim;
    r.model.heads = f.heads > 0 ? f.heads : 4;
    r.model.seq = f.seq;
    r.model.vocab = f.vocab;
    r.global_batch = f.batch;
    layout.micro_batch = 0;
  }
  if (!f.model_file.empty())
    r.model = plan::model_from_json(train::read_json_file(f.model_file), f.model_file);
  auto set = [&](const char* key, auto& field, auto value) {
    if (f.has(key)) field = value;
  };
  set("layers", r.model.layers, f.layers);
  set("dim", r.model.hidden, f.dim);
  set("heads", r.model.heads, f.heads);
  set("seq", r.model.seq, f.seq);
  set("vocab", r.model.vocab, f.vocab);
  set("context", r.model.context, f.context);
  set("dropout", r.model.dropout, f.dropout);
  set("moe_experts", r.model.moe.experts, f.moe_experts);
  set("moe_top_k", r.model.moe.top_k, f.moe_top_k);
  set("moe_every", r.model.moe.every, f.moe_every);
  set("moe_capacity_factor", r.model.moe.capacity_factor, f.moe_capacity_factor);
  if (f.has("arch")) r.model.arch = nn::parse_arch(f.arch);
  set("kv_heads", r.model.kv_heads, f.kv_heads);
  set("ffn_dim", r.model.ffn_dim, f.ffn_dim);
  set("tie_embeddings", r.model.tie_embeddings, f.tie_embeddings);
  set("qkv_bias", r.model.qkv_bias, f.qkv_bias);
  set("batch", r.global_batch, f.batch);
  set("bucket_mb", r.engine_options.bucket_mb, f.bucket_mb);
  if (f.has("optimizer")) r.engine_options.sgd = f.optimizer == "sgd";
  set("moe_skew", r.engine_options.moe_skew, f.moe_skew);
  plan::validate(r.model);

  r.cluster = plan::with_link(plan::load_cluster(f.cluster), f.link);
  r.engine = f.engine;
  r.precision = f.precision;
  if (f.dp_overlap >= 0) r.dp_overlap = f.dp_overlap;
  r.oversubscribe = f.oversubscribe;

  set("dp", layout.dp, f.dp);
  set("tp", layout.tp, f.tp);
  set("pp", layout.pp, f.pp);
  set("ep", layout.ep, f.ep);
  set("cp", layout.cp, f.cp);
  if (f.has("cp_comm")) layout.cp_comm = nn::parse_cp_comm(f.cp_comm);
  if (f.has("zero")) layout.zero = parallel::zero_stage(f.zero);
  if (f.has("zero_shard_group"))
    layout.zero_shard = train::parse_zero_shard_group(f.zero_shard_group);  // host: -1
  set("sp", layout.sp, f.sp);
  if (f.has("schedule")) layout.schedule = parallel::parse_schedule(f.schedule);
  set("virtual_stages", layout.virtual_stages, f.virtual_stages);
  set("micro_batch", layout.micro_batch, f.micro_batch);
  if (f.has("recompute")) layout.recompute = nn::parse_recompute(f.recompute);

  const bool ranking = f.rank || (f.config.empty() && !f.has("dp") && !f.has("tp") && !f.has("pp"));
  if (!ranking) {
    if (layout.micro_batch == 0) layout.micro_batch = std::max(1, r.global_batch / layout.dp);
    if (f.has("devices")) r.cluster = plan::with_devices(r.cluster, f.devices);
    const plan::Prediction p = plan::plan_layout(r, layout);
    std::printf("%s", plan::format_prediction(r, p).c_str());
    if (layout.zero_shard == plan::Layout::kShardByHost && p.layout.zero_shard == 1)
      std::printf(
          "note: --zero-shard-group host: tp=%d fills a node of %d devices, so each ZeRO shard "
          "group is one rank: nothing is sharded, and the replicas all-reduce every gradient "
          "(plain data parallelism)\n",
          layout.tp, r.cluster.devices_per_node);
    if (!f.json.empty()) {
      nlohmann::json j = {{"request", plan::request_json(r)}, {"prediction", plan::to_json(p)}};
      write_json(f.json, j);
    }
    exit_code = p.ok() ? 0 : 1;
    return;
  }
  const int devices = f.has("devices") ? f.devices : r.cluster.devices();
  if (f.has("devices")) r.cluster = plan::with_devices(r.cluster, f.devices);
  plan::LayoutSpace space;
  if (f.has("dp")) space.dp = layout.dp;
  if (f.has("tp")) space.tp = layout.tp;
  if (f.has("pp")) space.pp = layout.pp;
  if (f.has("ep")) space.ep = layout.ep;
  // Context parallelism only when asked: --cp holds it fixed, --max-cp enumerates it (a --config's
  // cp is held too, as its other keys are not).
  if (f.has("cp") || layout.cp > 1) space.cp = layout.cp;
  if (f.has("cp_comm")) space.cp_comm = layout.cp_comm;
  if (f.has("max_cp")) space.max_cp = f.max_cp;
  if (f.has("zero")) space.zero = layout.zero;
  if (f.has("zero_shard_group") || layout.zero_shard != 0) space.zero_shard = layout.zero_shard;
  if (f.has("sp")) space.sp = layout.sp;
  if (f.has("schedule")) space.schedule = layout.schedule;
  if (f.has("virtual_stages")) space.virtual_stages = layout.virtual_stages;
  if (f.has("micro_batch") && layout.micro_batch > 0) space.micro_batch = layout.micro_batch;
  if (f.has("recompute")) space.recompute = layout.recompute;
  const plan::Ranking k = plan::rank_layouts(r, devices, space, f.simulate_top);
  std::printf("%s", plan::format_ranking(r, k, f.top).c_str());
  if (!f.json.empty()) write_json(f.json, plan::to_json(r, k, f.top));
  exit_code = 0;
}

}  // namespace

void register_plan(CLI::App& root, int& exit_code) {
  auto f = std::make_shared<PlanFlags>();
  CLI::App* cmd = root.add_subcommand(
      "plan",
      "Predict a layout's memory per device, step time, tokens/s and MFU before launching it, or\n"
      "rank every layout of a device count (docs/PLANNER.md). The model takes train's flags or\n"
      "--config; the cluster is a shipped description (dev-vm, dgx-a100-80gb, dgx-h100) or a\n"
      "JSON file. With --dp/--tp/--pp (or --config) one layout is planned; without them every\n"
      "layout of --devices (default: the cluster's) is ranked, the given flags held fixed.\n"
      "--calibrate measures this machine into a cluster description (--out FILE); under mpirun it\n"
      "adds the MPI backend's link to FILE.");
  auto opt = [&](const std::string& key, auto& field, const std::string& help) {
    std::string name = "--" + key;
    for (char& c : name)
      if (c == '_') c = '-';
    f->given[key] = cmd->add_option(name, field, help)
                        ->capture_default_str()
                        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    return f->given[key];
  };
  opt("config", f->config, "A `tessera train` JSON config (model, batch, layout)");
  opt("model", f->model_file,
      "A model JSON ({layers, hidden, heads, seq, vocab, ...}) or a Hugging Face config.json");
  opt("layers", f->layers, "Transformer blocks");
  opt("dim", f->dim, "Model width");
  opt("heads", f->heads, "Attention heads (0: 4)");
  opt("seq", f->seq, "Tokens per sequence");
  opt("vocab", f->vocab, "Vocabulary size");
  opt("context", f->context, "Positions of the model (0: --seq)");
  opt("dropout", f->dropout, "Dropout probability (> 0 keeps dropout masks)");
  opt("arch", f->arch, "Model family: gpt2 or llama (rotary, RMSNorm, GQA, SwiGLU)");
  opt("kv_heads", f->kv_heads, "--arch llama: key/value heads (0: --heads)");
  opt("ffn_dim", f->ffn_dim, "--arch llama: SwiGLU width (0: 256 x ceil(8 dim / 3 / 256))");
  opt("tie_embeddings", f->tie_embeddings, "--arch llama: the head reads the token embedding");
  opt("qkv_bias", f->qkv_bias, "--arch llama: biases on q, k and v");
  opt("moe_experts", f->moe_experts, "Experts per MoE layer (0: dense)");
  opt("moe_top_k", f->moe_top_k, "Experts per token");
  opt("moe_every", f->moe_every, "Every n-th block is an MoE block");
  opt("moe_capacity_factor", f->moe_capacity_factor, "Expert capacity factor (0: dropless)");
  opt("moe_skew", f->moe_skew,
      "Routed rows of the busiest expert-parallel rank over balanced routing (1: balanced; "
      "docs/PLANNER.md says how to read it off a run's moe_load)");
  opt("batch", f->batch, "Global batch in sequences");
  opt("cluster", f->cluster, "Cluster description: a shipped name or a JSON file");
  opt("devices", f->devices, "Devices of the cluster's kind to plan for (default: all)");
  opt("engine", f->engine, "tessera or megatron accounting (default: the cluster's)");
  opt("precision", f->precision, "Compute dtype, a key of the cluster's peak_tflops");
  opt("link", f->link, "inproc or mpi: which calibrated link ranks of one node use");
  opt("dp", f->dp, "Data-parallel ranks");
  opt("tp", f->tp, "Tensor-parallel ranks");
  opt("pp", f->pp, "Pipeline stages");
  opt("ep", f->ep, "Expert-parallel ranks (a divisor of --dp)");
  opt("cp", f->cp,
      "Context-parallel ranks: every sequence split over them (--seq a multiple of 2 x cp; a "
      "ranking holds it fixed)");
  opt("cp_comm", f->cp_comm,
      "allgather, ring or ulysses: how the cp ranks' attention exchanges keys and values");
  opt("max_cp", f->max_cp,
      "Rankings: also try context parallelism, every cp up to this dividing the devices (each "
      "--cp-comm unless given; default 1: none)");
  opt("zero", f->zero, "ZeRO stage 0-3");
  opt("zero_shard_group", f->zero_shard_group,
      "HSDP: the ranks that share ZeRO shards: all (of dp x cp), host (a node's ranks; the "
      "shards all-reduced across nodes) or a number of ranks dividing dp x cp");
  // A bare switch, as in `tessera train`: --sp (or --sp=false).
  f->given["sp"] =
      cmd->add_flag("--sp", f->sp, "Sequence parallelism inside the tensor-parallel group");
  opt("schedule", f->schedule, "gpipe, 1f1b, interleaved or zb-h1");
  opt("virtual_stages", f->virtual_stages, "Model chunks per pipeline rank");
  opt("micro_batch", f->micro_batch, "Sequences per micro-batch (0: batch / dp)");
  opt("recompute", f->recompute, "none, selective or full");
  opt("bucket_mb", f->bucket_mb, "Gradient bucket size in MiB");
  opt("optimizer", f->optimizer, "adamw or sgd");
  opt("dp_overlap", f->dp_overlap,
      "Fraction of data-parallel communication hidden behind compute (default: the cluster's)");
  opt("json", f->json, "Also write the prediction or ranking as JSON to this file (- = stdout)");
  opt("top", f->top, "Rows of the ranking to print");
  opt("simulate_top", f->simulate_top, "Fastest estimated layouts to simulate and re-rank");
  opt("out", f->out, "--calibrate: write the cluster description here");
  opt("ranks", f->calibrate_ranks, "--calibrate: inproc ranks (devices of this machine)");
  f->given["rank"] =
      cmd->add_flag("--rank", f->rank, "Rank layouts even when --dp/--tp/--pp are given");
  f->given["oversubscribe"] = cmd->add_flag("--oversubscribe", f->oversubscribe,
                                            "Allow more ranks than devices (CPU ranks)");
  f->given["calibrate"] = cmd->add_flag("--calibrate", f->calibrate, "Measure this machine");
  f->given["quick"] = cmd->add_flag("--quick", f->quick, "--calibrate: fewer repetitions");
  cmd->callback([f, &exit_code]() { run(*f, exit_code); });
}

}  // namespace tessera::app
