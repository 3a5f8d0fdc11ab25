// A custom model (tessera's modules plus a user-written Adapter, adapter_gpt.h) trained with
// data parallelism and ZeRO, written against the library directly: the loop that
// train::run_training runs for a GPT, here for any nn::UnitModel.
//
// It trains the same model twice, on one rank and on 2 data-parallel ranks (threads) with ZeRO-3,
// and checks the promise: the same loss at every step (1e-5 relative), dropout on.
//
//   custom_model [text file] [zero stage 0..3]
#include <tessera/tessera.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "adapter_gpt.h"

namespace {

using namespace tessera;

constexpr int kSteps = 12, kBatch = 8, kMicroBatch = 2, kSeq = 32;

nn::GPTConfig model_config() {
  nn::GPTConfig c;
  c.n_layer = 2;  // the two blocks; the adapter sits between them
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = kSeq;
  c.vocab_size = 256;  // tokens are the text's bytes
  c.dropout = 0.1f;
  return c;
}

// Global sample i of step s: a window of the text whose start depends only on (s, i), so every
// layout sees the same global batch.
size_t window_start(int64_t step, int64_t sample, size_t text_size) {
  uint64_t z = static_cast<uint64_t>(step * kBatch + sample) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) % (text_size - kSeq - 1);
}

// One rank's training: returns the loss of every step (the same on every rank).
std::vector<double> train_rank(comm::Communicator& world, int zero, const std::string& text) {
  Allocator alloc("rank " + std::to_string(world.rank()));
  CurrentAllocatorScope alloc_scope(alloc);
  parallel::Mesh mesh(world, parallel::MeshShape{world.size(), 1, 1});  // all data-parallel
  const parallel::DataParallelOptions dpo{parallel::zero_stage(zero), /*bucket_mb=*/0.05,
                                          /*overlap=*/true};

  AdapterGPT model(model_config(), kMicroBatch, alloc,
                   parallel::flat_layout_for(dpo, world.size()));
  parallel::DataParallel dp(model, mesh.dp(), dpo, alloc);
  dp.initialize(/*seed=*/1337);  // layout-invariant: every shard draws what one device would
  dp.create_optimizer([&](std::vector<optim::Segment> segments, int64_t state_elems) {
    return std::make_unique<optim::AdamW>(std::move(segments), state_elems, optim::AdamWConfig{},
                                          alloc);
  });
  const optim::LrSchedule lr{3e-3f, /*warmup=*/2, kSteps, /*min_ratio=*/0.1f};

  AdapterGPT::Record rec = model.make_record();
  const int per_rank = kBatch / mesh.dp().size();
  std::vector<int32_t> tokens(kMicroBatch * kSeq), targets(tokens.size());
  std::vector<double> losses;
  for (int64_t step = 0; step < kSteps; ++step) {
    // The loss is normalised by the global token count, so any split of the batch is the same.
    const nn::StepContext ctx{1337, static_cast<uint64_t>(step), true, 1.0f / (kBatch * kSeq)};
    dp.begin_step();
    double loss_sum = 0;
    for (int m = 0; m < per_rank / kMicroBatch; ++m) {
      const int first = mesh.dp_rank() * per_rank + m * kMicroBatch;  // global sample index
      for (int i = 0; i < kMicroBatch; ++i) {
        const size_t at = window_start(step, first + i, text.size());
        for (int t = 0; t < kSeq; ++t) {
          tokens[i * kSeq + t] = static_cast<unsigned char>(text[at + t]);
          targets[i * kSeq + t] = static_cast<unsigned char>(text[at + t + 1]);
        }
      }
      loss_sum += model.forward(
          ctx, nn::Batch{tokens.data(), targets.data(), kMicroBatch, kSeq, first}, rec);
      // The engine reduces the gradients in the last micro-batch's backward.
      model.backward(rec, nn::BackwardPass{/*last_micro_batch=*/m == per_rank / kMicroBatch - 1});
    }
    dp.end_backward();  // every bucket reduced (ZeRO-2/3: into this rank's shard)
    losses.push_back(parallel::all_reduce_sum(mesh.dp(), loss_sum) / (kBatch * kSeq));
    const double norm = dp.grad_norm();  // global, each element counted once
    dp.clip(norm, 1.0);
    dp.optimizer_step(lr.at(step));
  }
  return losses;
}

std::string read_text(int argc, char** argv) {
  if (argc > 1) {
    std::ifstream in(argv[1], std::ios::binary);
    if (!in) throw ConfigError(std::string("cannot read ") + argv[1]);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  // A made-up text: sentences from small word lists.
  const char* who[] = {"the cat", "a dog", "the old man", "my sister", "the bird"};
  const char* does[] = {"sees", "likes", "follows", "finds", "draws"};
  const char* what[] = {"a red ball", "the river", "a small house", "the moon", "an apple"};
  std::string s;
  for (int i = 0; i < 400; ++i)
    s += std::string(who[i % 5]) + " " + does[(i / 5) % 5] + " " + what[(i / 25) % 5] + ".\n";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  kernels::use_fast_blas_kernels(argv);
  train::set_compute_threads(1);  // one BLAS thread per rank
  try {
    const std::string text = read_text(argc, argv);
    const int zero = argc > 2 ? std::stoi(argv[2]) : 3;
    if (text.size() < 2 * kSeq) throw ConfigError("the text needs at least 64 bytes");
    std::vector<double> one, two;
    comm::run_inproc(1, [&](comm::Communicator& c) { one = train_rank(c, 0, text); });
    comm::run_inproc(2, [&](comm::Communicator& c) {
      std::vector<double> l = train_rank(c, zero, text);
      if (c.rank() == 0) two = std::move(l);
    });
    double worst = 0;
    for (int s = 0; s < kSteps; ++s) {
      const double rel = std::abs(two[s] - one[s]) / std::abs(one[s]);
      worst = std::max(worst, rel);
      std::printf("step %2d  loss one rank %.6f  dp=2 ZeRO-%d %.6f\n", s + 1, one[s], zero, two[s]);
    }
    std::printf("largest relative difference %.2e (%s)\n", worst,
                worst <= 1e-5 ? "the same model" : "DIFFERENT");
    return worst <= 1e-5 && one.back() < one.front() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_model: %s\n", e.what());
    return 2;
  }
}
