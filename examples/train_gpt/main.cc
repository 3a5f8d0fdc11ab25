// Trains a small GPT-2 under a layout chosen in code: 2 data-parallel replicas x 2 pipeline stages
// x 2 tensor-parallel ranks, 8 ranks as threads of this process (or, started by mpirun -np 8, one
// rank per process). Any layout trains the same model as one rank; change the three numbers.
//
//   train_gpt [text file]
#include <tessera/tessera.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace {

// A made-up text of sentences from small word lists, when no file is given.
std::string write_sample_text(const std::string& path) {
  const char* who[] = {"the cat", "a dog", "the old man", "my sister", "the bird"};
  const char* does[] = {"sees", "likes", "follows", "finds", "draws"};
  const char* what[] = {"a red ball", "the river", "a small house", "the moon", "an apple"};
  std::ofstream out(path);
  for (int i = 0; i < 600; ++i)
    out << who[i % 5] << " " << does[(i / 5) % 5] << " " << what[(i / 25) % 5] << ".\n";
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::kernels::use_fast_blas_kernels(argv);
  tessera::train::TrainConfig cfg;
  cfg.data = argc > 1 ? argv[1] : write_sample_text("sample_text.txt");
  cfg.cache_dir = "tessera_cache";  // the trained tokenizer and the token file

  // The layout: world = dp x pp x tp ranks.
  cfg.dp = 2;
  cfg.pp = 2;
  cfg.tp = 2;
  cfg.schedule = tessera::parallel::ScheduleKind::OneFOneB;  // or GPipe, Interleaved, ZeroBubbleH1
  cfg.zero = 1;  // shard the optimizer state over the data-parallel ranks

  // A tiny model and a short run.
  cfg.vocab = 300;
  cfg.layers = 2;
  cfg.dim = 64;
  cfg.heads = 4;
  cfg.seq = 32;
  cfg.batch = 8;        // global batch in sequences: 4 per replica
  cfg.micro_batch = 2;  // 2 micro-batches per replica flow through the pipeline
  cfg.steps = 30;
  cfg.warmup = 3;
  cfg.lr = 3e-3f;
  cfg.dropout = 0.1f;
  cfg.eval_every = 15;
  cfg.sample_tokens = 40;
  cfg.threads = 1;  // BLAS threads per rank
  cfg.log_every = 10;

  try {
    const tessera::train::TrainResult r = tessera::train::run_training(cfg, stdout);
    if (r.rank != 0) return 0;
    std::printf("loss %.4f at step 1, %.4f at step %lld; validation %.4f; unigram entropy %.4f\n",
                r.losses.front(), r.losses.back(), static_cast<long long>(r.steps), r.last_val_loss,
                r.unigram_entropy);
    return r.losses.back() < r.losses.front() ? 0 : 1;
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 2;
  }
}
