// Train / validation split of a token sequence, and the (inputs, targets) window layout shared
// by the training sampler and the evaluation iterator.
#pragma once

#include <cstdint>

#include "tessera/data/token_source.h"

namespace tessera::data {

// Tokens [begin, end) of a TokenSource.
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const TokenRange&) const = default;
};

struct TrainValSplit {
  TokenRange train;
  TokenRange validation;  // empty when val_fraction == 0
};

// Splits by token position: the last floor(num_tokens * val_fraction) tokens are validation,
// the rest training (for a text corpus: the last documents, since documents keep their order;
// a window may still span an <|endoftext|>). val_fraction must be in [0, 1); 0 means no
// validation. Throws ConfigError for a fraction out of range or a split leaving either part,
// when non-empty, with fewer than min_tokens tokens (pass seq_len + 1).
TrainValSplit split_train_val(int64_t num_tokens, double val_fraction, int64_t min_tokens = 2);

// Writes one window: inputs[0..seq_len) = tokens [start, start + seq_len), targets[0..seq_len) =
// tokens [start + 1, start + seq_len + 1), as int32.
void read_window(const TokenSource& tokens, int64_t start, int seq_len, int32_t* inputs,
                 int32_t* targets);

}  // namespace tessera::data
