// Everything a training run is configured by. The same keys are accepted as command-line flags
// (`--grad-clip 1`) and in a JSON config file (`{"grad_clip": 1}`); flags win over the file.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "tessera/core/dtype.h"

namespace tessera::train {

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
  // Mixture of experts (nn/moe.h; the architecture comes from config.json when resuming).
  int moe_experts = 0;               // experts per MoE block; 0 = dense
  int moe_top_k = 2;                 // experts per token
  int moe_every = 1;                 // block l is MoE when l % every == every - 1
  float moe_capacity_factor = 0.0f;  // per-sequence capacity factor; 0 = dropless
  float moe_aux_loss = 0.01f;        // load-balancing loss coefficient (alpha)
  float moe_z_loss = 0.001f;         // router z-loss coefficient (beta)

  // Optimisation.
  int64_t steps = 1000;
  int batch = 16;       // global batch, in sequences
  int micro_batch = 0;  // sequences per forward/backward; 0 = the whole batch
  float lr = 3e-3f;
  int64_t warmup = 50;
  float min_lr_ratio = 0.1f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;           // 0 disables
  std::string optimizer = "adamw";  // adamw | sgd
  float momentum = 0.9f;            // sgd only
  float beta1 = 0.9f, beta2 = 0.95f;
  uint64_t seed = 1337;

  // Parallelism.
  int dp = 1;                     // data-parallel ranks (threads here, or the processes of mpirun)
  int tp = 1;                     // tensor-parallel ranks per data-parallel replica (world = dp*tp)
  bool sp = false;                // sequence parallelism inside the tensor-parallel group (tp > 1)
  int pp = 1;                     // pipeline stages (ranks); world = pp * dp * tp
  int ep = 1;                     // expert-parallel ranks, carved from dp (must divide it)
  std::string pp_split;           // units per model stage, e.g. "4,4"; "" = balanced by cost
  std::string schedule = "1f1b";  // pipeline schedule: gpipe | 1f1b | interleaved | zb-h1
  int virtual_stages = 1;         // model chunks per pipeline rank (interleaved schedule)
  int zero = 0;                   // ZeRO stage 0..3
  double bucket_mb = 25;          // gradient bucket size (MiB)
  bool overlap = true;            // overlap bucket communication with backward
  std::string backend = "auto";   // auto | inproc | mpi
  std::string trace;              // Chrome trace-event JSON of the run's timeline
  std::string recompute = "none";  // activation recomputation: none | selective | full
  // Mixed precision (kernels/precision.h, docs/ARCHITECTURE.md decision 33): "bf16" = GEMM inputs
  // in bf16 with fp32 accumulation; master weights, gradients, optimizer state, LayerNorm, softmax,
  // the loss and the router stay fp32. bf16_gemm: auto (oneDNN where the CPU has bf16 units, else
  // emulated) | onednn | emulated.
  std::string precision = "fp32";  // fp32 | bf16
  std::string bf16_gemm = "auto";
  // bf16 copies of the GEMM weights, converted once per forward instead of at every GEMM
  // (nn::GPTLayout::bf16_weight_copies; 2 bytes per weight, no ZeRO-3): auto (where the GEMMs run
  // through oneDNN) | on | off.
  std::string bf16_weight_copies = "auto";
  // The dtype of the data-parallel gradient reduction (fp32 | bf16: half the bytes; gradients are
  // accumulated in fp32 before and after) and of the exported model.safetensors (fp32 | bf16;
  // checkpoints always hold the fp32 masters).
  std::string grad_reduce_dtype = "fp32";
  std::string export_dtype = "fp32";
  // The dtypes of the other traffic: ZeRO-3 parameter gathers (each rank rounds its fp32 master
  // shard) and tensor- and pipeline-parallel activations and their gradients. auto = the
  // --precision (so bf16 runs move half the bytes), or fp32 | bf16.
  std::string param_gather_dtype = "auto";
  std::string activation_comm_dtype = "auto";
  // One rank's GEMM peak in GFLOP/s for the precision in use, the denominator of the progress
  // line's MFU (model FLOPs / (peak x ranks)); 0 = measured at start (kernels/gemm_peak.h).
  double peak_gflops = 0;
  // Deadline of every communication wait, in seconds; 0 = TESSERA_COMM_TIMEOUT_S, else 300.
  double comm_timeout = 0;
  // Deadline, in seconds, of the waits for one rank's file work: the others waiting while rank 0
  // writes a checkpoint, or (under mpirun) prepares the data and reads the checkpoint first.
  // Never shorter than the communication deadline.
  double io_timeout = 3600;

  // Run.
  int threads = 0;           // BLAS threads per rank; 0 = cores / ranks
  std::string memory_limit;  // e.g. "2GiB"; "" = unlimited
  std::string save;          // checkpoint directory
  std::string resume;        // checkpoint directory to resume from
  int64_t save_every = 0;    // 0 = only at the end (when --save is given)
  std::string metrics;       // JSON-lines file
  int64_t eval_every = 100;
  int eval_batches = 8;     // validation: the first eval_batches x batch windows, in every layout
  int sample_tokens = 200;  // generated at the end; 0 disables
  std::string prompt = "\n";
  float temperature = 0.8f;
  int top_k = 40;
  int log_every = 10;  // progress line cadence when not on a terminal

  // Throws ConfigError naming the offending key and what is accepted.
  void validate() const;
  int new_model_heads() const { return heads > 0 ? heads : 4; }
  int world() const { return dp * pp * tp; }  // ranks of the job
};

// "fp32" -> F32, "bf16" -> BF16; otherwise a ConfigError naming `flag` and the accepted values.
DType float_dtype(const std::string& s, const char* flag);

// "auto" -> the dtype of `precision`, else as float_dtype (a ConfigError naming `flag` and
// auto, fp32, bf16 otherwise).
DType comm_dtype(const std::string& s, const std::string& precision, const char* flag);

// ConfigError unless --tp divides the head count and the MLP width 4 * dim (Megatron's split).
void check_tensor_parallel(int heads, int dim, int tp);

nlohmann::json to_json(const TrainConfig& c);
// Starts from the defaults; unknown keys and values of the wrong type are ConfigErrors.
TrainConfig train_config_from_json(const nlohmann::json& j);
// Reads a JSON config file (ConfigError on a missing or malformed file).
nlohmann::json read_json_file(const std::string& path);

}  // namespace tessera::train
