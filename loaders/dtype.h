// Element types of safetensors files and packs.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace qtk {

// note: the set is safetensors' own; later stages reject, by name, what they
// cannot compute (for example F8_E4M3 weights).
enum class DType : uint8_t {
  BF16, F16, F32, F64,
  I8, I16, I32, I64,
  U8, U16, U32, U64,
  BOOL, F8_E4M3, F8_E5M2,
};

// Size of one element in bytes.
constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::BF16: case DType::F16: case DType::I16: case DType::U16: return 2;
    case DType::F32: case DType::I32: case DType::U32: return 4;
    case DType::F64: case DType::I64: case DType::U64: return 8;
    case DType::I8: case DType::U8: case DType::BOOL:
    case DType::F8_E4M3: case DType::F8_E5M2: return 1;
  }
  return 0;
}

// The safetensors spelling: "BF16", "F32", ...
std::string_view dtype_name(DType t);

// Parses the safetensors spelling; nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view name);

}  // namespace qtk
