// Gradient exchange for device ranks through host memory: device to host, the communicator's
// all-reduce (in-process threads or MPI), host to device. What ranks that share one GPU use (NCCL
// refuses two ranks on one device), so every data-parallel layout can be tested on a single GPU;
// the reduction order is the communicator's, as on CPU ranks.
#pragma once

#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/cuda/gpt.h"

namespace tessera::cuda {

class HostStagedReducer {
 public:
  HostStagedReducer(Gpt& model, comm::Communicator& group);
  ~HostStagedReducer();
  HostStagedReducer(const HostStagedReducer&) = delete;
  HostStagedReducer& operator=(const HostStagedReducer&) = delete;
  // Sums the model's flat gradients over the group (every rank calls it).
  void all_reduce_gradients();
  // Sums a host value over the group (a loss, a token count) in double.
  double all_reduce(double v);

 private:
  Gpt& model_;
  comm::Communicator& group_;
  float* host_ = nullptr;  // pinned, the flat gradient buffer's size
};

}  // namespace tessera::cuda
