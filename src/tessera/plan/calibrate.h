// `tessera plan --calibrate`: a cluster description of this machine, measured. One device is one
// core running one rank with one BLAS thread (how the planner counts tessera's CPU ranks); compute
// rates are timed in the thread's CPU time, so that other tenants of a shared machine do not
// lower them (their turns on the core would count in wall time), links in wall time:
//   peak_tflops.fp32       single-thread sgemm at 2048^3
//   matmul_efficiency      the rate of the matmuls of a reference model (its layers' GEMMs in
//                          forward and backward shapes, and the per-head attention GEMMs) over
//                          that peak
//   gemm_efficiency        sgemm's rate over that peak on a grid of (M, N, K), each 16 to 2048
//                          in powers of 2 (quick: 16 to 1024 in powers of 4), operands in L2
//                          and from beyond it (gemm_efficiency.h), which the tessera engine
//                          interpolates at each GEMM's own shape
//   attention_efficiency   the attention kernel (forward, backward, softmax included) by context
//                          64 to 2048 and head size 16 to 128
//   memory_bandwidth_gbs   the rate of tessera's elementwise kernels (LayerNorm, GELU, residual,
//                          cross-entropy, AdamW) on a micro-batch of the reference model, in the
//                          planner's accounting of their traffic (a 256 MiB memcpy is recorded too)
//   intra_node             the inproc all-reduce among `ranks` threads (comm/bench.h): bus
//                          bandwidth at 16-64 MiB, and alpha = the 4-byte time / (2 (n - 1))
// Under mpirun, calibrate_mpi measures the MPI backend the same way (calibration.mpi).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <ostream>

#include "tessera/comm/communicator.h"
#include "tessera/plan/cluster.h"
#include "tessera/plan/model_spec.h"

namespace tessera::plan {

struct CalibrationOptions {
  int ranks = 2;        // inproc collective ranks (threads), also the devices of the node
  ModelSpec reference;  // the model whose matmul shapes set the efficiency
  int micro_batch = 8;
  bool quick = false;  // fewer repetitions (tests)
  CalibrationOptions() {
    reference.layers = 4;
    reference.hidden = 256;
    reference.heads = 4;
    reference.seq = 128;
    reference.vocab = 512;
  }
};

ClusterSpec calibrate_this_machine(const CalibrationOptions& o, std::ostream* log);

// Collective over `world` (every rank calls it): the link its backend provides, as
// {"bandwidth_gbs", "latency_us", "ranks", "backend"}.
nlohmann::json calibrate_link(comm::Communicator& world, bool quick, std::ostream* log);

// `c` with its intra-node link replaced by calibration.<backend> ("mpi"); ConfigError when the
// file has no such measurement.
ClusterSpec with_link(ClusterSpec c, const std::string& backend);

}  // namespace tessera::plan
