// The steps of a rank whose model runs on a GPU (`tessera train --device cuda`; cuda/gpt.h,
// docs/ARCHITECTURE.md decision 43). The rank keeps its CPU model as the host copy: it is
// initialised, restored from a checkpoint, saved, sampled from and evaluated as on a CPU rank,
// and the device copy takes its parameters and optimizer state before the first step (upload) and
// gives them back before anything on the host reads them (download). Data-parallel gradients
// meet through host memory over the rank's gradient group (cuda/host_staged.h), in the group's
// fixed reduction order, so a --device cuda layout trains what its CPU layout trains (to fp32
// rounding of the device's kernels).
//
// In a build without CUDA (TESSERA_CUDA=OFF, or no nvcc) constructing one throws a ConfigError
// that says so.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tessera/comm/communicator.h"
#include "tessera/kernels/precision.h"
#include "tessera/nn/gpt.h"
#include "tessera/optim/optimizer.h"
#include "tessera/train/train_config.h"

namespace tessera::train {

// "" when this build can run --device cuda; otherwise why not.
std::string device_unavailable_reason();

// The GPU a rank takes: rank_in_machine modulo the devices this process sees (thread ranks of one
// process spread over its GPUs; MPI processes of one machine take their local rank's), so a
// machine's GPUs are shared evenly when there are more ranks than GPUs. CUDA_VISIBLE_DEVICES
// narrows the choice. 0 where no device is visible.
int device_for_rank(int rank_in_machine);
// The rank's place among the ranks of its machine: its world rank for thread ranks (one process),
// the launcher's local rank (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK, MPICH's MPI_LOCALRANKID) for
// MPI processes (0 when the launcher does not say).
int rank_in_machine(int world_rank, bool mpi);

class DeviceSteps {
 public:
  // host: the rank's whole model on the CPU (its parameter layout and values); host_optimizer: its
  // AdamW over whole parameters (state laid out like the flat buffer); micro x seq: the largest
  // micro-batch; memory_limit: bytes of device memory (0: the device's); group: the gradient group.
  // device: the GPU (device_for_rank). exchange: NCCL when every member of the group has a GPU
  // of its own (collective over the group: the members compare host and device), else through
  // host memory; DeviceComm::Nccl where they share one, or in a build without NCCL, is a
  // ConfigError.
  DeviceSteps(nn::GPT& host, optim::Optimizer& host_optimizer, int micro, int seq,
              kernels::Precision precision, size_t memory_limit, comm::Communicator& group,
              const std::string& rank_name, int device, DeviceComm exchange = DeviceComm::Auto);
  ~DeviceSteps();
  DeviceSteps(const DeviceSteps&) = delete;
  DeviceSteps& operator=(const DeviceSteps&) = delete;

  // Host -> device: parameters, optimizer state and its step count.
  void upload();
  // Device -> host, the same.
  void download();

  void begin_step();
  // A micro-batch's forward and backward; returns its loss sum (gradients accumulate).
  double forward_backward(const nn::Batch& b, const nn::StepContext& ctx);
  // Sums the gradients over the group.
  void reduce_gradients();
  double grad_norm();
  void clip(double norm, double max_norm);
  void step(float lr);
  // The loss sum of an evaluation batch (no dropout).
  double evaluate(const nn::Batch& b);

  // "NVIDIA H200 (cuda:0), bf16, gradients summed by NCCL".
  std::string describe() const;
  int device() const;
  size_t peak_bytes() const;
  // The device's dense bf16 peak in FLOP/s (0: unknown), MFU's denominator.
  double peak_flops() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::train
