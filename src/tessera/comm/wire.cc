#include "tessera/comm/wire.h"

#include <cstring>

#include "tessera/core/error.h"
#include "tessera/kernels/bf16.h"

namespace tessera::comm {

namespace {
void copy_floats(float* dst, const float* src, int64_t n) {
  if (dst != src && n > 0) std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
}
}  // namespace

void check_wire_dtype(DType wire) {
  TESSERA_ASSERT(wire == DType::F32 || wire == DType::BF16, "fp32 data cannot travel as ",
                 dtype_name(wire));
}

Tensor wire_buffer(int64_t n, const char* label, Allocator* alloc) {
  return Tensor::empty({n}, DType::BF16, MemCategory::Buffers, label, alloc);
}

void to_wire(Tensor& wire, int64_t offset, const float* src, int64_t n) {
  TESSERA_ASSERT(wire.dtype() == DType::BF16 && offset >= 0 && offset + n <= wire.numel(),
                 "wire buffer of ", wire.numel(), " elements, writing [", offset, ", ", offset + n,
                 ")");
  kernels::f32_to_bf16(wire.data<uint16_t>() + offset, src, n);
}

Tensor to_wire(const float* src, int64_t n, const char* label, Allocator* alloc) {
  Tensor wire = wire_buffer(n, label, alloc);
  to_wire(wire, 0, src, n);
  return wire;
}

void from_wire(float* dst, const Tensor& wire, int64_t offset, int64_t n) {
  TESSERA_ASSERT(wire.dtype() == DType::BF16 && offset >= 0 && offset + n <= wire.numel(),
                 "wire buffer of ", wire.numel(), " elements, reading [", offset, ", ", offset + n,
                 ")");
  kernels::bf16_to_f32(dst, wire.data<uint16_t>() + offset, n);
}

void add_from_wire(float* dst, const Tensor& wire, int64_t offset, int64_t n) {
  TESSERA_ASSERT(wire.dtype() == DType::BF16 && offset >= 0 && offset + n <= wire.numel(),
                 "wire buffer of ", wire.numel(), " elements, reading [", offset, ", ", offset + n,
                 ")");
  const uint16_t* src = wire.data<uint16_t>() + offset;
  for (int64_t i = 0; i < n; ++i) dst[i] += from_bf16(bf16{src[i]});
}

void all_reduce_as(DType wire, Communicator& c, float* x, int64_t n) {
  check_wire_dtype(wire);
  if (c.size() == 1 || n == 0) return;
  if (wire == DType::F32) {
    c.all_reduce(x, static_cast<size_t>(n), DType::F32).wait();
  } else {
    Tensor w = to_wire(x, n, "wire.all_reduce");
    c.all_reduce(w.raw(), static_cast<size_t>(n), DType::BF16).wait();
    from_wire(x, w, 0, n);
  }
}

void all_gather_as(DType wire, Communicator& c, const float* slice, float* full, int64_t count) {
  check_wire_dtype(wire);
  if (c.size() == 1) {
    copy_floats(full, slice, count);
    return;
  }
  if (count == 0) return;
  if (wire == DType::F32) {
    c.all_gather(slice, full, static_cast<size_t>(count), DType::F32).wait();
  } else {
    const int64_t place = c.rank() * count;
    Tensor w = wire_buffer(c.size() * count, "wire.all_gather");
    to_wire(w, place, slice, count);
    uint16_t* b = w.data<uint16_t>();
    c.all_gather(b + place, b, static_cast<size_t>(count), DType::BF16).wait();  // in place
    from_wire(full, w, 0, c.size() * count);
  }
}

void reduce_scatter_as(DType wire, Communicator& c, const float* full, float* slice,
                       int64_t count) {
  check_wire_dtype(wire);
  if (c.size() == 1) {
    copy_floats(slice, full, count);
    return;
  }
  if (count == 0) return;
  if (wire == DType::F32) {
    c.reduce_scatter(full, slice, static_cast<size_t>(count), DType::F32).wait();
  } else {
    const int64_t place = c.rank() * count;
    Tensor w = to_wire(full, c.size() * count, "wire.reduce_scatter");
    uint16_t* b = w.data<uint16_t>();
    c.reduce_scatter(b, b + place, static_cast<size_t>(count), DType::BF16).wait();  // in place
    from_wire(slice, w, place, count);
  }
}

}  // namespace tessera::comm
