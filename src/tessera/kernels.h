// tessera/kernels.h: the public API of the kernels layer (docs/API.md).
// CPU kernels as free functions on raw float pointers (each says whether it assigns or
// accumulates), and the choice of OpenBLAS kernels.
#pragma once

#include "tessera/kernels/attention.h"
#include "tessera/kernels/bf16.h"
#include "tessera/kernels/blas_setup.h"
#include "tessera/kernels/cpu_features.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/embedding.h"
#include "tessera/kernels/flash_attention.h"
#include "tessera/kernels/gelu.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/layernorm.h"
#include "tessera/kernels/precision.h"
#include "tessera/kernels/residual.h"
#include "tessera/kernels/rmsnorm.h"
#include "tessera/kernels/rope.h"
#include "tessera/kernels/row_map.h"
#include "tessera/kernels/softmax_xent.h"
#include "tessera/kernels/swiglu.h"
