// Element types and bf16 conversion.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace tessera {

// F64 comes last so that the values of the others stay what they were.
enum class DType : uint8_t { F32, BF16, F16, I32, I64, U16, U8, F64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U16:
      return 2;
    case DType::U8:
      return 1;
    case DType::F64:
      return 8;
  }
  return 0;
}

// Names as safetensors writes them.
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U16:
      return "U16";
    case DType::U8:
      return "U8";
    case DType::F64:
      return "F64";
  }
  return "?";
}

// bf16 is the top half of an fp32; conversion rounds to nearest, ties to even, keeps NaN a NaN.
struct bf16 {
  uint16_t bits = 0;
};

inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

inline float from_bf16(bf16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace tessera
