// The build without oneDNN: bf16 GEMMs take the emulated path (precision.h).
#include "tessera/core/error.h"
#include "tessera/kernels/gemm_onednn.h"
#include "tessera/kernels/precision.h"

namespace tessera::kernels {

bool onednn_built() {
  return false;
}

void gemm_bf16_onednn(bool, bool, int, int, int, float, GemmInput, int, GemmInput, int, float,
                      float*, int) {
  TESSERA_ASSERT(false, "gemm_bf16_onednn called in a build without oneDNN");
}

}  // namespace tessera::kernels
