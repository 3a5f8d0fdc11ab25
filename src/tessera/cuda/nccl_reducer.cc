#include "tessera/cuda/nccl_reducer.h"

#include <chrono>
#include <thread>

#include "tessera/comm/errors.h"
#include "tessera/core/dtype.h"
#include "tessera/core/error.h"

namespace tessera::cuda {

void check_nccl(ncclResult_t r, std::string_view what) {
  if (r == ncclSuccess) return;
  throw Error(detail::concat("nccl: ", what, " failed: ", ncclGetErrorString(r)));
}

namespace {
using Clock = std::chrono::steady_clock;

std::chrono::milliseconds deadline_of(const comm::Communicator& group) {
  const comm::Timeout t = group.options().timeout;
  return t == comm::kDefaultTimeout ? std::chrono::milliseconds(300'000)
                                    : std::chrono::milliseconds(t.count());
}
}  // namespace

NcclReducer::NcclReducer(Gpt& model, comm::Communicator& group) : model_(model), group_(group) {
  ncclUniqueId id{};
  if (group.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  group.broadcast(&id, sizeof id, DType::U8, comm::BroadcastOptions{}).wait();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; wait() polls against the deadline
  check_nccl(ncclCommInitRankConfig(&comm_, group.size(), id, group.rank(), &config),
             "ncclCommInitRankConfig");
  wait("ncclCommInitRankConfig");
}

NcclReducer::~NcclReducer() {
  if (comm_ != nullptr) {
    // A finished communicator is destroyed; one left mid-call (an error) is aborted.
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess) {
      (void)ncclCommFinalize(comm_);
      (void)ncclCommDestroy(comm_);
    } else {
      (void)ncclCommAbort(comm_);
    }
  }
}

void NcclReducer::wait(const char* what) {
  const auto deadline = Clock::now() + deadline_of(group_);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    if (state != ncclInProgress) {
      check_nccl(state, what);
      const cudaError_t s = cudaStreamQuery(model_.stream());
      if (s == cudaSuccess) return;
      if (s != cudaErrorNotReady) check(s, detail::concat(what, " (its stream)"));
    }
    if (Clock::now() > deadline) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
      throw comm::TimeoutError(detail::concat(
          "nccl: ", what, " on communicator '", group_.name(), "' rank ", group_.rank(), "/",
          group_.size(), " did not finish within ", deadline_of(group_).count() / 1000.0,
          " s (a peer that stopped or never called); the NCCL communicator was aborted"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclReducer::all_reduce_gradients() {
  float* g = model_.device_grads();
  check_nccl(ncclAllReduce(g, g, static_cast<size_t>(model_.numel()), ncclFloat32, ncclSum, comm_,
                           model_.stream()),
             "ncclAllReduce of the gradients");
  wait("ncclAllReduce of the gradients");
}

}  // namespace tessera::cuda
