#include "kernels/embedding.h"

#include <cstring>

#include "core/error.h"

namespace qtk {

void embedding_lookup(const void* table, DType t, int64_t hidden, const int32_t* ids, int64_t n,
                      float* out) {
  if (t != DType::BF16 && t != DType::F32 && t != DType::F16) {
    fail("embedding_lookup: table dtype: expected BF16, F16 or F32, found {}", dtype_name(t));
  }
  for (int64_t i = 0; i < n; ++i) {
    float* dst = out + i * hidden;
    int64_t row = static_cast<int64_t>(ids[i]) * hidden;
    if (t == DType::F32) {
      std::memcpy(dst, static_cast<const float*>(table) + row, hidden * sizeof(float));
      continue;
    }
    const uint16_t* src = static_cast<const uint16_t*>(table) + row;
    for (int64_t j = 0; j < hidden; ++j) {
      uint32_t bits;
      if (t == DType::BF16) {
        bits = static_cast<uint32_t>(src[j]) << 16;
      } else {
        // note: IEEE half to float, exact (subnormals normalised).
        uint32_t h = src[j];
        uint32_t sign = (h & 0x8000u) << 16;
        uint32_t e = (h >> 10) & 0x1Fu;
        uint32_t m = h & 0x3FFu;
        if (e == 0) {
          if (m == 0) {
            bits = sign;
          } else {
            int shift = 0;
            while ((m & 0x400u) == 0) {
              m <<= 1;
              ++shift;
            }
            bits =
                sign | (static_cast<uint32_t>(127 - 15 + 1 - shift) << 23) | ((m & 0x3FFu) << 13);
          }
        } else if (e == 31) {
          bits = sign | 0x7F800000u | (m << 13);
        } else {
          bits = sign | ((e + 127 - 15) << 23) | (m << 13);
        }
      }
      std::memcpy(dst + j, &bits, 4);
    }
  }
}

}  // namespace qtk
