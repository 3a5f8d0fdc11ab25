// A cluster description: nodes of identical devices, what each device computes and holds, and
// the links between them. Read from JSON (share/tessera/clusters/*.json), written by
// `tessera plan --calibrate`.
//
// Units in the file: memory in GiB, FLOP/s in TFLOP/s (1e12), bandwidths in GB/s (1e9 bytes/s),
// latencies in microseconds. A link's bandwidth is what one device sends per second over it while
// every device of its node communicates at the same time (for the network: the node's NICs
// divided by its devices); its latency is the fixed cost of one step of a ring algorithm.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/plan/gemm_efficiency.h"

namespace tessera::plan {

struct LinkSpec {
  double bandwidth_gbs = 0;
  double latency_us = 0;
  double bytes_per_second() const { return bandwidth_gbs * 1e9; }
  double latency_seconds() const { return latency_us * 1e-6; }
};

struct ClusterSpec {
  std::string name;
  std::string description;
  std::vector<std::string> sources;  // data sheets and measurements the figures come from
  int nodes = 1;
  int devices_per_node = 1;
  double device_memory_gib = 0;
  std::map<std::string, double> peak_tflops;  // per dtype: "fp32", "tf32", "bf16", "fp16"
  // The fraction of the peak the model's matrix multiplications reach (one number for all).
  double matmul_efficiency = 1;
  // Optional, by GEMM shape (calibrated CPU clusters): the tessera engine costs each GEMM at its
  // own shape's efficiency; empty: matmul_efficiency for every GEMM.
  GemmEfficiency gemm_efficiency;
  // Optional: tessera's attention kernel by context and head size (with gemm_efficiency).
  AttentionEfficiency attention_efficiency;
  // Device memory traffic (reads + writes) per second, GB/s: elementwise kernels, the optimizer.
  double memory_bandwidth_gbs = 0;
  LinkSpec intra_node;  // between devices of one node (NVLink/NVSwitch; shared memory here)
  LinkSpec inter_node;  // between nodes, per device (InfiniBand)
  // Defaults for plans on this cluster (docs/PLANNER.md): the accounting ("tessera": this code
  // base, fp32 on CPU ranks; "megatron": mixed precision as Megatron-LM and the papers count it),
  // the compute dtype, and how much of the data-parallel gradient communication overlaps compute.
  std::string engine = "megatron";
  std::string precision = "bf16";
  double dp_overlap = 0;
  double reserved_gib = 0;  // held by the runtime on every device (context, communicator buffers)
  nlohmann::json calibration;  // raw measurements (calibrated clusters only)

  int devices() const { return nodes * devices_per_node; }
  double memory_bytes() const { return device_memory_gib * 1073741824.0; }
  double peak_flops(const std::string& dtype) const;  // ConfigError when the file has no entry
};

// ConfigError naming the source and the key on missing or malformed fields.
ClusterSpec cluster_from_json(const nlohmann::json& j, const std::string& source);
nlohmann::json to_json(const ClusterSpec& c);

// `name_or_path`: a JSON file, or the name of a shipped description ("dgx-a100-80gb") looked up
// in the directories of TESSERA_CLUSTER_PATH (colon-separated) and then the source tree's
// share/tessera/clusters. ConfigError listing what exists when nothing matches.
ClusterSpec load_cluster(const std::string& name_or_path);
std::vector<std::string> shipped_cluster_names();

// The same cluster with `nodes` nodes (a plan for N devices on a larger or smaller installation).
ClusterSpec with_devices(ClusterSpec c, int devices);

}  // namespace tessera::plan
