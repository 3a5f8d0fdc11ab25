#include "tessera/data/dataset.h"

#include <cmath>

#include "tessera/core/error.h"

namespace tessera::data {

TrainValSplit split_train_val(int64_t num_tokens, double val_fraction, int64_t min_tokens) {
  TESSERA_CHECK_AS(ConfigError, val_fraction >= 0.0 && val_fraction < 1.0,
                   "the validation fraction ", val_fraction,
                   " is out of range; it must be in [0, 1) (0 = no validation split)");
  const auto n_val =
      static_cast<int64_t>(std::floor(static_cast<double>(num_tokens) * val_fraction));
  TrainValSplit s{{0, num_tokens - n_val}, {num_tokens - n_val, num_tokens}};
  TESSERA_CHECK_AS(ConfigError, s.train.size() >= min_tokens, "the training split has ",
                   s.train.size(), " tokens (of ", num_tokens, ", validation fraction ",
                   val_fraction, "); it needs at least ", min_tokens,
                   " (one window of sequence length + 1); use more data, a shorter sequence or a "
                   "smaller validation fraction");
  TESSERA_CHECK_AS(ConfigError, n_val == 0 || n_val >= min_tokens, "the validation split has ",
                   n_val, " tokens (of ", num_tokens, ", validation fraction ", val_fraction,
                   "); it needs at least ", min_tokens,
                   " (one window of sequence length + 1), or a fraction of 0 for none");
  return s;
}

void read_window(const TokenSource& tokens, int64_t start, int seq_len, int32_t* inputs,
                 int32_t* targets) {
  tokens.read(start, seq_len, inputs);
  tokens.read(start + 1, seq_len, targets);
}

}  // namespace tessera::data
