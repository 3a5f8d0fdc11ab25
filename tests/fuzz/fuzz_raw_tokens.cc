// Fuzz target: a raw nanoGPT token file (`train.bin`: headerless little-endian uint16) read
// against a vocabulary size, then sampled for training and evaluation as the trainer does.
// Input layout: 4 bytes little-endian int32 vocabulary size, 1 byte sequence length (1 + b % 64),
// then the file's bytes.
#include <algorithm>
#include <memory>
#include <vector>

#include "fuzz_util.h"
#include "tessera/core/error.h"
#include "tessera/data/dataset.h"
#include "tessera/data/eval_windows.h"
#include "tessera/data/prepare.h"
#include "tessera/data/sampler.h"

using namespace tessera;

namespace {

void check_rows(const std::vector<int32_t>& in, const std::vector<int32_t>& tgt, int rows, int seq,
                int64_t vocab) {
  for (int r = 0; r < rows; ++r) {
    for (int t = 0; t < seq; ++t) {
      const size_t i = static_cast<size_t>(r) * static_cast<size_t>(seq) + static_cast<size_t>(t);
      fuzz::require(in[i] >= 0 && in[i] < vocab && tgt[i] >= 0 && tgt[i] < vocab,
                    "sampled ids are inside the vocabulary");
      if (t + 1 < seq) fuzz::require(tgt[i] == in[i + 1], "targets are the inputs shifted by one");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const int32_t vocab = static_cast<int32_t>(
      static_cast<uint32_t>(data[0]) | (static_cast<uint32_t>(data[1]) << 8) |
      (static_cast<uint32_t>(data[2]) << 16) | (static_cast<uint32_t>(data[3]) << 24));
  const int seq = 1 + data[4] % 64;
  const auto path = fuzz::write_input("train.bin", data + 5, size - 5);
  try {
    const data::PreparedData p = data::prepare_data({.data = path, .vocab_size = vocab});
    fuzz::require(p.tokens->size() > 0, "prepared tokens are not empty");
    fuzz::require(static_cast<int64_t>(p.tokens->max_id()) < p.vocab_size,
                  "prepared ids are below the vocabulary size");
    if (p.format == data::DataFormat::kRawUint16) {
      fuzz::require(p.vocab_size == vocab && p.tokens->size() == static_cast<int64_t>(size - 5) / 2,
                    "a raw file holds (size / 2) ids bounded by the given vocabulary");
    }
    const data::TrainValSplit split = data::split_train_val(p.tokens->size(), 0.25, seq + 1);
    constexpr int kRows = 3;
    std::vector<int32_t> in(static_cast<size_t>(kRows) * static_cast<size_t>(seq)), tgt(in.size());
    data::WindowSampler sampler(p.tokens, split.train, {.seq_len = seq, .seed = 7});
    for (int b = 0; b < 3; ++b) {
      sampler.next_batch(kRows, 0, kRows, in.data(), tgt.data());
      check_rows(in, tgt, kRows, seq, p.vocab_size);
    }
    if (split.validation.size() > 0) {
      const data::EvalWindows eval(p.tokens, split.validation, seq);
      for (int64_t b = 0; b < std::min<int64_t>(eval.num_batches(kRows), 4); ++b) {
        const int64_t rows = eval.fetch_batch(b, kRows, in.data(), tgt.data());
        check_rows(in, tgt, static_cast<int>(rows), seq, p.vocab_size);
      }
    }
  } catch (const Error& e) {
    fuzz::rejected(
        e);  // The expected outcome for a malformed file or a vocabulary it does not fit.
  }
  return 0;
}
