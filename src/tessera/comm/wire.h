// fp32 data that travels in a narrower dtype (docs/ARCHITECTURE.md, decision 33). Under
// --precision bf16 gradient reductions (--grad-reduce-dtype), ZeRO-3 parameter gathers
// (--param-gather-dtype) and tensor- and pipeline-parallel activations (--activation-comm-dtype)
// can travel in bf16: the sender rounds its fp32 values to bf16 (nearest even) into a *wire*
// buffer, the collective or message moves the wire (reductions sum bf16 in fp32 per combining step,
// docs/COMM.md), and the receiver widens the result back into fp32 (exact). Half the bytes; what is
// computed and stored stays fp32. With DType::F32 the functions below move the fp32 data itself.
//
// Wire buffers are tensors of the allocator's Buffers category, freed when the call returns (the
// synchronous functions) or when the caller drops them (to_wire, wire_buffer).
#pragma once

#include <cstdint>

#include "tessera/comm/communicator.h"
#include "tessera/core/tensor.h"

namespace tessera::comm {

// A dtype data may travel in: F32 or BF16 (an internal error otherwise).
void check_wire_dtype(DType wire);

// An uninitialised bf16 wire buffer of n elements (`alloc`: default the current allocator).
Tensor wire_buffer(int64_t n, const char* label, Allocator* alloc = nullptr);
// ASSIGNS wire[offset, offset + n) = src[n] rounded to bf16.
void to_wire(Tensor& wire, int64_t offset, const float* src, int64_t n);
// A new bf16 wire buffer holding src[n] rounded to bf16.
Tensor to_wire(const float* src, int64_t n, const char* label, Allocator* alloc = nullptr);
// ASSIGNS dst[n] = wire[offset, offset + n) as fp32 (exact).
void from_wire(float* dst, const Tensor& wire, int64_t offset, int64_t n);
// ACCUMULATES dst[n] += wire[offset, offset + n) as fp32.
void add_from_wire(float* dst, const Tensor& wire, int64_t offset, int64_t n);

// Synchronous collectives on fp32 data that travels in `wire` (the communicator counts the bytes
// it sends, Communicator::traffic()). x[n] = sum over the group of x[n].
void all_reduce_as(DType wire, Communicator& c, float* x, int64_t n);
// full[size * count] = every rank's slice[count] in rank order; slice may be this rank's place in
// full (full + rank * count).
void all_gather_as(DType wire, Communicator& c, const float* slice, float* full, int64_t count);
// slice[count] = the sum over the group of full[rank * count, + count); slice may be that place
// in full.
void reduce_scatter_as(DType wire, Communicator& c, const float* full, float* slice, int64_t count);

}  // namespace tessera::comm
