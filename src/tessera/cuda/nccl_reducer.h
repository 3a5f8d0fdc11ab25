// Gradient exchange for ranks with a GPU each: NCCL's all-reduce over the device buffers, in the
// model's stream (no host copies). The ranks of a group that share a GPU use the host-staged
// exchange instead (host_staged.h): NCCL refuses two ranks on one device.
//
// Every wait has the group's deadline (its CommOptions::timeout): the communicator is created
// non-blocking and each call is polled against the deadline; past it the NCCL communicator is
// aborted and a comm::TimeoutError names the call, so a dead peer cannot hang the job. NCCL picks
// its own reduction order (rings or trees by topology): results equal the host-staged exchange's
// to fp32 rounding, not bitwise.
#pragma once

#include <nccl.h>

#include <string_view>

#include "tessera/comm/communicator.h"
#include "tessera/cuda/gpt.h"

namespace tessera::cuda {

// Throws tessera::Error "nccl: <what> failed: <ncclGetErrorString>" unless r == ncclSuccess.
void check_nccl(ncclResult_t r, std::string_view what);

class NcclReducer {
 public:
  // Collective over `group` (every member calls it, each from its own thread or process, with its
  // model on its own device): rank 0 of the group makes NCCL's unique id and broadcasts it over
  // `group`, then each member joins the NCCL communicator as its rank in `group`.
  NcclReducer(Gpt& model, comm::Communicator& group);
  ~NcclReducer();
  NcclReducer(const NcclReducer&) = delete;
  NcclReducer& operator=(const NcclReducer&) = delete;

  // Sums the model's flat gradients over the group, in place; returns when the sum is done.
  void all_reduce_gradients();

 private:
  // Polls until the NCCL communicator has no call in progress and the model's stream is done;
  // aborts it and throws comm::TimeoutError naming `what` past the deadline.
  void wait(const char* what);

  Gpt& model_;
  comm::Communicator& group_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace tessera::cuda
