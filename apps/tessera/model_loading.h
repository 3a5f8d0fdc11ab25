// Shared by `eval` and `sample`: their GEMM precision flags. The model and its tokenizer come
// from train::load_model (train/model_io.h).
#pragma once

#include <string>

#include "tessera/kernels/precision.h"

namespace tessera::app {

// --precision and --bf16-gemm of eval and sample, parsed (ConfigError naming the accepted values).
// Under bf16 says on stderr which GEMM path the model uses.
kernels::GemmMode gemm_mode_from_flags(const std::string& precision, const std::string& bf16_gemm);

}  // namespace tessera::app
