// tessera/core.h: the public API of the core layer (docs/API.md).
// Tensors, the per-rank allocator, dtypes, errors, the Philox counter RNG, timeline tracing.
#pragma once

#include "tessera/core/allocator.h"
#include "tessera/core/cpu_time.h"
#include "tessera/core/dtype.h"
#include "tessera/core/error.h"
#include "tessera/core/mapped_file.h"
#include "tessera/core/philox.h"
#include "tessera/core/tensor.h"
#include "tessera/core/trace.h"
