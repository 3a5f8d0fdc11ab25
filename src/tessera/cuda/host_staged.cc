#include "tessera/cuda/host_staged.h"

#include "tessera/core/dtype.h"

namespace tessera::cuda {

HostStagedReducer::HostStagedReducer(Gpt& model, comm::Communicator& group)
    : model_(model), group_(group) {
  // Pinned: the copies run at the link's speed and need no staging copy of their own.
  check(cudaMallocHost(reinterpret_cast<void**>(&host_),
                       sizeof(float) * static_cast<size_t>(model.numel())),
        "cudaMallocHost of the gradient staging buffer");
}

HostStagedReducer::~HostStagedReducer() {
  if (host_ != nullptr) cudaFreeHost(host_);
}

void HostStagedReducer::all_reduce_gradients() {
  const size_t n = static_cast<size_t>(model_.numel());
  copy_to_host(host_, model_.device_grads(), sizeof(float) * n, model_.stream());
  group_.all_reduce(host_, n, DType::F32).wait();
  copy_to_device(model_.device_grads(), host_, sizeof(float) * n, model_.stream());
}

double HostStagedReducer::all_reduce(double v) {
  group_.all_reduce(&v, 1, DType::F64).wait();
  return v;
}

}  // namespace tessera::cuda
