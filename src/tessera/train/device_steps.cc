#include "tessera/train/device_steps.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/optim/grad_clip.h"

#ifdef TESSERA_WITH_CUDA
#include <unistd.h>

#include "tessera/cuda/gpt.h"
#include "tessera/cuda/host_staged.h"
#include "tessera/parallel/gather.h"
#ifdef TESSERA_WITH_NCCL
#include "tessera/cuda/nccl_reducer.h"
#endif
#endif

namespace tessera::train {

#ifdef TESSERA_WITH_CUDA

std::string device_unavailable_reason() {
  if (!cuda::available()) return "no CUDA device is visible to this process";
  return "";
}

int device_for_rank(int rank_in_machine) {
  const int n = cuda::device_count();
  return n > 0 ? rank_in_machine % n : 0;
}

struct DeviceSteps::Impl {
  Impl(nn::GPT& h, optim::Optimizer& o, int device, comm::Communicator& g,
       const optim::AdamWConfig& a)
      : host(h), opt(o), info(cuda::device_info(device)), group(g), adam(a) {}
  nn::GPT& host;
  optim::Optimizer& opt;
  cuda::DeviceInfo info;
  comm::Communicator& group;
  optim::AdamWConfig adam;
  std::unique_ptr<cuda::Gpt> gpu;
  // One of the two exchanges, when the group has more than one rank. Destroyed before the model.
  std::unique_ptr<cuda::HostStagedReducer> reducer;
#ifdef TESSERA_WITH_NCCL
  std::unique_ptr<cuda::NcclReducer> nccl;
#endif
  float* state(const char* kind) {
    for (auto& [name, t] : opt.state_buffers())
      if (name == kind) return t.f32();
    throw InternalError(detail::concat("the host optimizer has no '", kind, "' state"));
  }
};

DeviceSteps::DeviceSteps(nn::GPT& host, optim::Optimizer& host_optimizer, int micro, int seq,
                         kernels::Precision precision, size_t memory_limit,
                         comm::Communicator& group, const std::string& rank_name, int device,
                         DeviceComm exchange) {
  const std::string why = device_unavailable_reason();
  TESSERA_CHECK_AS(ConfigError, why.empty(), "--device cuda: ", why);
  auto* adam = dynamic_cast<optim::AdamW*>(&host_optimizer);
  TESSERA_CHECK_AS(ConfigError, adam != nullptr, "--device cuda trains with adamw only so far");
  // The host optimizer's state must be laid out like the flat buffer (whole parameters, ZeRO 0).
  const nn::ParameterSet& ps = host.params();
  for (const optim::Segment& s : host_optimizer.segments())
    TESSERA_ASSERT(s.param_offset == 0 && s.state_offset == ps.infos()[s.param].offset &&
                       s.n == ps.infos()[s.param].local_numel(),
                   "--device cuda needs the optimizer state of whole parameters");
  cuda::GptOptions o;
  o.precision =
      precision == kernels::Precision::BF16 ? cuda::Precision::BF16 : cuda::Precision::F32;
  o.max_batch = micro;
  o.seq_len = seq;
  o.memory_limit = memory_limit;
  o.name = "cuda " + rank_name;
  o.device = device;
  impl_ = std::make_unique<Impl>(host, host_optimizer, device, group, adam->config());
  impl_->gpu = std::make_unique<cuda::Gpt>(host.config(), ps, ps.flat_params().f32(), o);
  if (group.size() == 1) return;
  // Does every member of the group have a GPU of its own? (host name and device, compared.)
  char machine[256] = {};
  ::gethostname(machine, sizeof machine - 1);
  const std::vector<std::string> places =
      parallel::all_gather_strings(group, detail::concat(machine, ":", device));
  bool own = true;
  for (size_t i = 0; i < places.size(); ++i)
    for (size_t j = i + 1; j < places.size(); ++j) own = own && places[i] != places[j];
#ifdef TESSERA_WITH_NCCL
  TESSERA_CHECK_AS(ConfigError, exchange != DeviceComm::Nccl || own, config_key("device_comm"),
                   " nccl needs a GPU per rank, but ranks of the gradient group share one (",
                   group.size(), " ranks; --device-comm host or auto sums through host memory)");
  if (own && exchange != DeviceComm::Host) {
    impl_->nccl = std::make_unique<cuda::NcclReducer>(*impl_->gpu, group);
    return;
  }
#else
  TESSERA_CHECK_AS(ConfigError, exchange != DeviceComm::Nccl, config_key("device_comm"),
                   " nccl: this tessera was built without NCCL (nccl.h and libnccl not found)");
  (void)own;
#endif
  impl_->reducer = std::make_unique<cuda::HostStagedReducer>(*impl_->gpu, group);
}

DeviceSteps::~DeviceSteps() = default;

void DeviceSteps::upload() {
  Impl& m = *impl_;
  m.gpu->set_params(m.host.params().flat_params().f32());
  m.gpu->set_optimizer_state(m.state("exp_avg"), m.state("exp_avg_sq"), m.opt.steps());
}

void DeviceSteps::download() {
  Impl& m = *impl_;
  m.gpu->get_params(m.host.params().flat_params().f32());
  m.host.params().bf16_copies_stale();  // (a host forward converts the new values)
  m.gpu->get_optimizer_state(m.state("exp_avg"), m.state("exp_avg_sq"));
  m.opt.set_steps(m.gpu->steps());
}

void DeviceSteps::begin_step() {
  impl_->gpu->zero_grads();
}

double DeviceSteps::forward_backward(const nn::Batch& b, const nn::StepContext& ctx) {
  return impl_->gpu->forward_backward(b, ctx);
}

void DeviceSteps::reduce_gradients() {
#ifdef TESSERA_WITH_NCCL
  if (impl_->nccl) return impl_->nccl->all_reduce_gradients();
#endif
  if (impl_->reducer) impl_->reducer->all_reduce_gradients();
}

double DeviceSteps::grad_norm() {
  return std::sqrt(impl_->gpu->grad_sum_squares());
}

void DeviceSteps::clip(double norm, double max_norm) {
  const float scale = optim::clip_scale(norm, max_norm);
  if (scale != 1.0f) impl_->gpu->scale_grads(scale);
}

void DeviceSteps::step(float lr) {
  impl_->gpu->adamw_step(impl_->adam, lr);
}

double DeviceSteps::evaluate(const nn::Batch& b) {
  return impl_->gpu->evaluate(b);
}

std::string DeviceSteps::describe() const {
  const char* exchange = impl_->reducer ? ", gradients summed through host memory" : "";
#ifdef TESSERA_WITH_NCCL
  if (impl_->nccl) exchange = ", gradients summed by NCCL";
#endif
  return detail::concat(impl_->info.name, " (cuda:", impl_->info.index, "), ",
                        cuda::to_string(impl_->gpu->precision()), exchange);
}

size_t DeviceSteps::peak_bytes() const {
  return impl_->gpu->allocator().peak();
}

double DeviceSteps::peak_flops() const {
  return cuda::bf16_peak_flops(impl_->info);
}

int DeviceSteps::device() const {
  return impl_->info.index;
}

#else  // no CUDA in this build

std::string device_unavailable_reason() {
  return "this tessera was built without CUDA (configure with -DTESSERA_CUDA=ON on a machine with "
         "the CUDA toolkit)";
}

struct DeviceSteps::Impl {};

int device_for_rank(int) {
  return 0;
}

DeviceSteps::DeviceSteps(nn::GPT&, optim::Optimizer&, int, int, kernels::Precision, size_t,
                         comm::Communicator&, const std::string&, int, DeviceComm) {
  throw ConfigError("--device cuda: " + device_unavailable_reason());
}
DeviceSteps::~DeviceSteps() = default;
void DeviceSteps::upload() {}
void DeviceSteps::download() {}
void DeviceSteps::begin_step() {}
double DeviceSteps::forward_backward(const nn::Batch&, const nn::StepContext&) {
  return 0;
}
void DeviceSteps::reduce_gradients() {}
double DeviceSteps::grad_norm() {
  return 0;
}
void DeviceSteps::clip(double, double) {}
void DeviceSteps::step(float) {}
double DeviceSteps::evaluate(const nn::Batch&) {
  return 0;
}
std::string DeviceSteps::describe() const {
  return "";
}
size_t DeviceSteps::peak_bytes() const {
  return 0;
}
double DeviceSteps::peak_flops() const {
  return 0;
}
int DeviceSteps::device() const {
  return 0;
}

#endif

int rank_in_machine(int world_rank, bool mpi) {
  if (!mpi) return world_rank;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"})
    if (const char* v = std::getenv(var)) return std::max(0, std::atoi(v));
  return 0;
}

}  // namespace tessera::train
