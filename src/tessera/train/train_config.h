// Everything a training run is configured by, typed: the strings of a command line or a JSON file
// (precision "bf16", schedule "zb-h1", ...) become enumerations once, when they are read, and the
// libraries below take the typed values.
//
// One table of fields (train_config_fields(): key, type, default, help, own rule) drives the JSON
// mapping (to_json / train_config_from_json), the command-line flags of `tessera train` (each key
// is a flag: "grad_clip" is --grad-clip) and the validation of single values; validate() adds the
// rules that relate several keys. Errors name the key with config_key() (core/error.h), which a
// JSON reader sees as "grad_clip" and the command renders as "--grad-clip".
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/core/dtype.h"
#include "tessera/kernels/precision.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::train {

enum class OptimizerKind { AdamW, Sgd };

// Where a rank's model runs: its CPU cores, or one CUDA GPU (train/device_steps.h).
enum class Device { Cpu, Cuda };
// How --device cuda ranks sum their gradients: NCCL when each rank of the gradient group has its
// own GPU (Auto), or through host memory over the communicator.
enum class DeviceComm { Auto, Nccl, Host };

// What a kind of traffic travels in: the --precision's dtype (Auto), fp32 or bf16.
enum class WireDtype { Auto, Fp32, Bf16 };
DType resolve(WireDtype w, kernels::Precision p);

struct TrainConfig {
  // Data.
  std::string data;            // text file/dir, token file, or nanoGPT .bin; "" = default corpus
  int vocab = 512;             // BPE vocabulary size when training a tokenizer on text
  double val_fraction = 0.05;  // 0 disables validation
  std::string cache_dir = "runs/cache";  // tokenizer and token files prepared from text

  // Model (ignored where --init-from weights determine them).
  int layers = 4;
  int dim = 192;
  int heads = 0;  // 0: 4 for a new model, config.json's for --init-from
  int seq = 128;  // context length used for training; also the model's block size
  float dropout = 0.0f;
  std::string init_from;  // safetensors weights to start from
  // A new model's family and its Llama-family settings (nn/gpt_config.h), or a Hugging Face
  // config.json (`model`) that gives the whole architecture.
  nn::Arch arch = nn::Arch::Gpt2;
  std::string model;
  int kv_heads = 0;  // 0: --heads (multi-head attention)
  int ffn_dim = 0;   // 0: Llama's rule, 256 * ceil(8 dim / 3 / 256)
  double rope_theta = 10000.0;
  bool tie_embeddings = true;
  bool qkv_bias = false;
  // Mixture of experts (nn/moe.h; the architecture comes from config.json when resuming).
  int moe_experts = 0;               // experts per MoE block; 0 = dense
  int moe_top_k = 2;                 // experts per token
  int moe_every = 1;                 // block l is MoE when l % every == every - 1
  float moe_capacity_factor = 0.0f;  // per-sequence capacity factor; 0 = dropless
  float moe_aux_loss = 0.01f;        // load-balancing loss coefficient (alpha)
  float moe_z_loss = 0.001f;         // router z-loss coefficient (beta)
  nn::RouterScore moe_router = nn::RouterScore::Softmax;  // the router's scores
  bool moe_renormalize = true;                            // the top-k gates divided by their sum
  // Auxiliary-loss-free balancing (train/moe_bias.h): the selection bias's step u per optimizer
  // step; 0: off (a bias the model already has stays as it is).
  float moe_bias_rate = 0.0f;
  int moe_ffn_dim = 0;           // --arch llama: an expert's SwiGLU width; 0: --ffn-dim's
  int moe_shared_ffn_dim = 0;    // --arch llama: the shared expert's width; 0: none
  bool moe_shared_gate = false;  // --arch llama: the shared expert scaled by sigmoid(x . w)

  // Optimisation.
  int64_t steps = 1000;
  int batch = 16;       // global batch, in sequences
  int micro_batch = 0;  // sequences per forward/backward; 0 = the whole batch
  float lr = 3e-3f;
  int64_t warmup = 50;
  float min_lr_ratio = 0.1f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;  // 0 disables
  OptimizerKind optimizer = OptimizerKind::AdamW;
  float momentum = 0.9f;  // sgd only
  float beta1 = 0.9f, beta2 = 0.95f;
  uint64_t seed = 1337;

  // Parallelism.
  int dp = 1;       // data-parallel ranks (threads here, or the processes of mpirun)
  int tp = 1;       // tensor-parallel ranks per data-parallel replica
  bool sp = false;  // sequence parallelism inside the tensor-parallel group (tp > 1)
  int pp = 1;       // pipeline stages (ranks); world = pp * dp * cp * tp
  int ep = 1;       // expert-parallel ranks, carved from dp (must divide it)
  // Context parallelism (nn/context_parallel.h): each sequence split over cp ranks (load-balanced
  // head and tail chunks), the attention exchanging keys and values by cp_comm.
  int cp = 1;
  nn::CpComm cp_comm = nn::CpComm::AllGather;
  std::string pp_split;  // units per model stage, e.g. "4,4"; "" = balanced by cost
  parallel::ScheduleKind schedule = parallel::ScheduleKind::OneFOneB;  // with pp > 1
  int virtual_stages = 1;  // model chunks per pipeline rank (interleaved schedule)
  int zero = 0;            // ZeRO stage 0..3 (parallel::zero_stage)
  // HSDP (train/hosts.h): the ranks that share ZeRO shards, "all" of dp x cp, "host" (those
  // on one host; replicated across hosts) or a number of ranks dividing dp x cp.
  std::string zero_shard_group = "all";
  double bucket_mb = 25;  // gradient bucket size (MiB)
  bool overlap = true;    // overlap bucket communication with backward
  comm::Backend backend = comm::Backend::Auto;
  // Under mpirun: thread ranks in each process (the hierarchical backend, comm/mpi/hier_comm.h);
  // 0 = one rank per process on the MPI backend.
  int ranks_per_process = 0;
  std::string trace;  // Chrome trace-event JSON of the run's timeline
  nn::Recompute recompute = nn::Recompute::None;
  // Mixed precision (kernels/precision.h, docs/ARCHITECTURE.md decision 33): bf16 = GEMM inputs in
  // bf16 with fp32 accumulation; master weights, gradients, optimizer state, LayerNorm, softmax,
  // the loss and the router stay fp32.
  kernels::Precision precision = kernels::Precision::F32;
  kernels::Bf16Gemm bf16_gemm = kernels::Bf16Gemm::Auto;
  // bf16 copies of the GEMM weights, converted once per forward (nn::GPTLayout).
  nn::WeightCopies bf16_weight_copies = nn::WeightCopies::Auto;
  // The dtype of the data-parallel gradient reduction and of the exported model.safetensors
  // (F32 or BF16; checkpoints always hold the fp32 masters).
  DType grad_reduce_dtype = DType::F32;
  DType export_dtype = DType::F32;
  double export_shard_mb =
      0;  // exported weights in Hugging Face's shards of at most this; 0: one file
  // ZeRO-3 parameter gathers, and tensor- and pipeline-parallel activations and their gradients.
  WireDtype param_gather_dtype = WireDtype::Auto;
  WireDtype activation_comm_dtype = WireDtype::Auto;
  // One rank's GEMM peak in GFLOP/s for the precision in use, the denominator of the progress
  // line's MFU; 0 = measured at start (train::choose_peak).
  double peak_gflops = 0;
  // Deadline of every communication wait, in seconds; 0 = TESSERA_COMM_TIMEOUT_S, else 300.
  double comm_timeout = 0;
  // Deadline, in seconds, of the waits for one rank's file work (never below comm_timeout).
  double io_timeout = 3600;
  // Directory of the flight recorder's dumps (comm/flight_recorder.h): each rank's last
  // communication calls, written on a communication failure or timeout, an injected fault, a
  // rank's error and SIGUSR2; "" = TESSERA_FLIGHT_RECORDER, else none.
  std::string flight_recorder;

  // Run.
  Device device = Device::Cpu;
  DeviceComm device_comm = DeviceComm::Auto;
  int threads = 0;           // BLAS threads per rank; 0 = cores / ranks
  std::string memory_limit;  // e.g. "2GiB"; "" = unlimited
  std::string save;          // checkpoint directory
  std::string resume;        // checkpoint directory to resume from
  int64_t save_every = 0;    // 0 = only at the end (when --save is given)
  // --save-every checkpoints written by a background thread while training goes on (rank 0 keeps
  // one host copy of the gathered state until it is written; docs/RELIABILITY.md). The final and
  // the stop's checkpoint are written before the run returns either way.
  bool save_async = true;
  std::string metrics;  // JSON-lines file
  // Supervised restarts (train/supervisor.h, docs/RELIABILITY.md): the command runs each attempt as
  // a child and restarts a failed one from the newest checkpoint in --save, up to max_restarts
  // times; min_dp > 0 lets it drop data-parallel replicas that keep failing, down to min_dp (the
  // global batch kept through more micro-batches); hang_timeout (seconds, 0 = io_timeout + 2 x
  // the communication deadline) ends an attempt that reports no step for that long; mpirun, when
  // set, is the command line (without -np) that starts each attempt's ranks as processes.
  int max_restarts = 0;
  int min_dp = 0;
  double hang_timeout = 0;
  std::string mpirun;
  int64_t eval_every = 100;
  int eval_batches = 8;     // validation: the first eval_batches x batch windows, in every layout
  int sample_tokens = 200;  // generated at the end; 0 disables
  std::string prompt = "\n";
  float temperature = 0.8f;
  int top_k = 40;
  int log_every = 10;  // progress line cadence when not on a terminal

  // Every field's own rule (train_config_fields) and the rules relating several fields. Throws a
  // ConfigError naming the keys and what is accepted.
  void validate() const;
  int new_model_heads() const { return heads > 0 ? heads : 4; }
  int world() const { return dp * pp * cp * tp; }  // ranks of the job
};

// One key of TrainConfig.
struct ConfigField {
  enum class Kind { Integer, Number, Boolean, Text, Choice };
  std::string key;    // the JSON key, "grad_clip"; the flag is flag_of(key), "--grad-clip"
  std::string group;  // the section of --help: "Data", "Model", "Optimisation", ...
  std::string help;
  Kind kind = Kind::Text;
  std::vector<std::string> choices;  // Choice: the accepted values
  // A Boolean given as a bare flag (--sp, --sp=false); other Booleans take a value (--overlap
  // false).
  bool bare_flag = false;
  std::function<nlohmann::json(const TrainConfig&)> get;
  // Reads a JSON value into the field: a ConfigError naming the key for a value of the wrong type,
  // one that does not fit the field exactly, or one the field's rule rejects.
  std::function<void(TrainConfig&, const nlohmann::json&)> set;
  // The field's own rule on its current value (ConfigError naming the key).
  std::function<void(const TrainConfig&)> check;
};

// The fields, in the order of --help.
const std::vector<ConfigField>& train_config_fields();
// "grad_clip" -> "--grad-clip".
std::string flag_of(const std::string& key);
// A command-line value as the JSON value the field reads ("3" -> 3, "bf16" -> "bf16", "false" ->
// false); a ConfigError naming the key when the text is not of the field's type.
nlohmann::json value_from_text(const ConfigField& f, const std::string& text);

// Every key, as JSON (enumerations by name: "precision": "bf16").
nlohmann::json to_json(const TrainConfig& c);
// Starts from the defaults; unknown keys, values of the wrong type and values a field's rule
// rejects are ConfigErrors naming the key. (Rules between keys wait for validate().)
TrainConfig train_config_from_json(const nlohmann::json& j);
// Reads a JSON config file (ConfigError on a missing or malformed file).
nlohmann::json read_json_file(const std::string& path);

// ConfigError unless `tp` divides the head count and the MLP width 4 * dim (Megatron's split).
void check_tensor_parallel(int heads, int dim, int tp);
// The same for a model of any family: heads, key/value heads and the MLP width.
void check_tensor_parallel(const nn::GPTConfig& m, int tp);

const char* to_string(OptimizerKind k);
const char* to_string(WireDtype w);

// --zero-shard-group (HSDP, train/hosts.h): 0 for "all", -1 for "host", else a positive
// number of ranks; ConfigError naming the key for anything else.
int parse_zero_shard_group(const std::string& setting);

}  // namespace tessera::train
