// Internal: a GEMM input as a module's record keeps it (decision 33). Under bf16 GEMM inputs the
// record keeps the bits of the bf16 values a bf16 GEMM would round the activation to anyway; the
// forward computes the activation in fp32 scratch first ("staging"), feeds that to its consumers,
// and rounds it into the record, so nothing is rounded twice and every number is that of an fp32
// record. With an fp32 record the staging is the record itself.
#pragma once

#include <cstdint>

#include "tessera/core/tensor.h"
#include "tessera/kernels/bf16.h"
#include "tessera/kernels/gemm.h"

namespace tessera::nn {

// What a GEMM reads of a kept activation: its fp32 values or its bf16 bits.
inline kernels::GemmInput kept(const Tensor& t) {
  if (t.dtype() == DType::BF16) return t.data<uint16_t>();
  return t.f32();
}

// Where the forward computes an activation the record keeps: in the record (fp32), or in fp32
// scratch that keep_rounded then rounds into the record (bf16).
inline float* staging(const Tensor& rec, const Tensor& scratch) {
  return rec.dtype() == DType::BF16 ? scratch.f32() : rec.f32();
}
inline void keep_rounded(Tensor& rec, const float* staged, int64_t n) {
  if (rec.dtype() == DType::BF16) kernels::f32_to_bf16(rec.data<uint16_t>(), staged, n);
}

}  // namespace tessera::nn
