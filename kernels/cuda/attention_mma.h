// Tensor-core paged attention for bf16 activations (private to attention.cu).
#pragma once

#include "kernels/cuda/cuda_kernels.h"

namespace qtk::cuda {

// The shapes the tensor-core kernel handles: head_dim 32/64/128/256, a GQA
// group (Hq/Hkv) dividing 64, q/out rows 16-byte aligned. The choice depends
// only on the model's shapes and buffers, never on the batch.
bool attention_mma_supported(const bf16* q, int64_t ldq, const bf16* out, int64_t ldo, int64_t hq,
                             int64_t hkv, int64_t d);

// Same contract as paged_attention<bf16> (cuda_kernels.h); call only when
// attention_mma_supported() is true.
void paged_attention_mma(const bf16* q, int64_t ldq, const bf16* k_cache, const bf16* v_cache,
                         bf16* out, int64_t ldo, const AttentionBatch& b, int64_t hq, int64_t hkv,
                         int64_t d, float scale, cudaStream_t stream);

}  // namespace qtk::cuda
