// Embedding table lookup.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace qtk {

// out[i, :] = table[ids[i], :] as f32.
//   table: bf16 | f16 | f32 [vocab, hidden]; out: f32 [n, hidden] contiguous.
// ids must be in range (the runtime validates prompts). Throws qtk::Error for
// other table dtypes.
void embedding_lookup(const void* table, DType t, int64_t hidden, const int32_t* ids, int64_t n,
                      float* out);

}  // namespace qtk
