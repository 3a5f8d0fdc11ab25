// NCCL's gradient exchange (cuda/nccl_reducer.h) for thread ranks with a GPU each: the sum of every
// rank's flat gradient buffer, against the sum done on the host. One rank per visible GPU, up to
// four (a machine with one GPU runs a group of one: creation, the call and teardown). Skipped
// where no CUDA device is present or the build has no NCCL.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "tessera/comm/launch.h"
#include "tessera/core/allocator.h"
#include "tessera/cuda/gpt.h"
#include "tessera/cuda/runtime.h"
#include "tessera/nn/gpt.h"

#ifdef TESSERA_WITH_NCCL
#include "tessera/cuda/nccl_reducer.h"
#endif

namespace tessera::cuda {
namespace {

#ifdef TESSERA_WITH_NCCL
TEST(NcclReducer, SumsTheGradientsOfRanksWithAGpuEach) {
  if (!available()) GTEST_SKIP() << "no CUDA device";
  const int world = std::min(device_count(), 4);
  nn::GPTConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 32;
  c.block_size = 8;
  c.vocab_size = 50;
  Allocator alloc("cpu");
  nn::GPT layout(c, 1, alloc);
  layout.initialize(3);
  const nn::ParameterSet& ps = layout.params();
  const int64_t n = ps.numel();
  // Rank r's gradients: random values of its own seed.
  auto grads_of = [&](int r) {
    std::mt19937 rng(static_cast<uint32_t>(100 + r));
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> g(static_cast<size_t>(n));
    for (float& x : g) x = d(rng);
    return g;
  };
  std::vector<double> want(static_cast<size_t>(n), 0.0);
  for (int r = 0; r < world; ++r) {
    const std::vector<float> g = grads_of(r);
    for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] += g[static_cast<size_t>(i)];
  }
  std::vector<std::vector<float>> got(static_cast<size_t>(world));
  comm::run_inproc(world, [&](comm::Communicator& group) {
    GptOptions o;
    o.device = group.rank();
    o.name = "cuda rank " + std::to_string(group.rank());
    Gpt gpu(c, ps, ps.flat_params().f32(), o);
    NcclReducer nccl(gpu, group);
    const std::vector<float> g = grads_of(group.rank());
    gpu.set_grads(g.data());
    nccl.all_reduce_gradients();
    got[static_cast<size_t>(group.rank())] = gpu.grads();
  });
  for (int r = 0; r < world; ++r) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d =
          got[static_cast<size_t>(r)][static_cast<size_t>(i)] - want[static_cast<size_t>(i)];
      num += d * d;
      den += want[static_cast<size_t>(i)] * want[static_cast<size_t>(i)];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-6) << "rank " << r << " of " << world;
  }
}
#endif

}  // namespace
}  // namespace tessera::cuda
