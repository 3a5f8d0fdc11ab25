// The build without oneDNN: bf16 GEMMs take the emulated path (precision.h).
#include "tessera/core/error.h"
#include "tessera/kernels/gemm_onednn.h"
#include "tessera/kernels/precision.h"

namespace tessera::kernels {

bool onednn_built() {
  return false;
}

void gemm_bf16_onednn(bool, bool, int, int, int, float, const float*, int, const float*, int, float,
                      float*, int) {
  TESSERA_ASSERT(false, "gemm_bf16_onednn called in a build without oneDNN");
}

void gemm_bf16_onednn_a16(bool, bool, int, int, int, float, const uint16_t*, int, const float*, int,
                          float, float*, int) {
  TESSERA_ASSERT(false, "gemm_bf16_onednn called in a build without oneDNN");
}

}  // namespace tessera::kernels
