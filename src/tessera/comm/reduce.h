// Internal: elementwise reduction kernels used by the in-process backend (and for Mean on MPI).
#pragma once

#include <cstddef>

#include "tessera/comm/options.h"
#include "tessera/core/dtype.h"

namespace tessera::comm::detail {

// dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[k-1][i]) for i < count, combining in source order
// (so every rank computing the same element gets the same bits). Mean combines as Sum and, when
// mean_divisor > 0, divides the result by it. dst may alias a source exactly (in place).
// bf16 is accumulated in fp32 across the k sources and rounded once; F32, F64, I32 and I64 in
// their own type.
void reduce_n(void* dst, const void* const* srcs, int k, size_t count, DType dtype, ReduceOp op,
              int mean_divisor);

// The same reduction written to each of dsts[0..ndst) (each may alias a source exactly: a block
// is read from every source before it is written anywhere). streaming: non-temporal stores, for
// destinations this thread will not read again; the caller issues the store fence
// (store_fence()) before publishing that the data is written.
void reduce_n_to(void* const* dsts, int ndst, bool streaming, const void* const* srcs, int k,
                 size_t count, DType dtype, ReduceOp op, int mean_divisor);

// Orders earlier non-temporal stores before later stores (sfence on x86, no-op elsewhere).
void store_fence();

// buf[i] /= divisor (integers truncate).
void divide(void* buf, size_t count, DType dtype, int divisor);

}  // namespace tessera::comm::detail
