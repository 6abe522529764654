// Paged causal attention over many sequences at once (prefill chunks and
// decode tokens in one call), with grouped-query heads, and the KV-cache write.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/thread_pool.h"

namespace qtk {

struct AttentionBatch {
  int64_t num_seqs = 0;
  const int32_t* q_start = nullptr;      // int32 [num_seqs + 1]: query row offsets into q
  const int32_t* seq_len = nullptr;      // int32 [num_seqs]: tokens in the cache incl. this step's
  const int32_t* block_table = nullptr;  // int32 [num_seqs][max_blocks]: physical block ids
  int64_t max_blocks = 0;
  int64_t block_size = 0;
  int64_t num_blocks = 0;  // blocks in the cache arena (kv heads are num_blocks blocks apart)
};

// Query row i (0-based within its sequence's q_len = q_start[s+1]-q_start[s]
// rows) of sequence s sits at position seq_len[s] - q_len + i and attends to
// cache positions 0..that position.
//   q: f32 [T, Hq, D] row stride ldq; out: f32 [T, Hq, D] row stride ldo
//   k_cache: f32 [Hkv, num_blocks, D, block_size]  (keys in the last index)
//   v_cache: f32 [Hkv, num_blocks, block_size, D]
//   query head h reads kv head h / (Hq / Hkv).
//   scratch: paged_attention_scratch_floats(max context, pool threads) floats.
// note: K is stored transposed inside each block so that 16 keys fill the
// lanes of a vector: a score is then one straight sum over d (no horizontal
// reduction), and each K vector loaded serves up to 8 query vectors (query
// rows x heads of a group). V keeps rows of D so that p_j * v_j is a vector
// axpy over d. Both are kv-head-major: what one (sequence, kv head) task
// reads is block_size * D contiguous floats per block (8 KiB for D = 128,
// block 16), and a sequence's blocks, mostly allocated together with
// consecutive ids, are contiguous too, so the hardware prefetcher streams
// them. Measured on Zen 4, reading 8 KiB pieces 64 KiB apart runs at 8
// GB/s against 23 GB/s for one sequential stream (token-major V rows, one
// line per 4 KiB page, were slower still).
// note: batch invariance: every (query row, head) output is computed by one
// thread with an exact two-pass softmax in key-position order: all scores
// (each a D-dot summed in increasing d, separate multiply and add), their
// max, the sum of exp(s - max) in position order (in double), the
// exp-weighted sum of V rows in position order, and one division. Nothing
// depends on the block size, the other sequences, the query rows it is
// grouped with, the thread count or how the prompt was chunked; an online
// softmax would rescale at block boundaries and break this. Every ISA clone
// computes the same bits.
void paged_attention(const float* q, int64_t ldq, const float* k_cache, const float* v_cache,
                     float* out, int64_t ldo, const AttentionBatch& b, int64_t Hq, int64_t Hkv,
                     int64_t D, float scale, float* scratch, ThreadPool* pool);

size_t paged_attention_scratch_floats(int64_t max_total_context, int threads);

// Writes token t's K and V rows (f32 [Hkv*D], row strides ldk, ldv) to cache
// slot slot_mapping[t] = block * block_size + offset, in the cache layouts
// above (num_blocks blocks per kv head); a negative slot skips the token.
void kv_cache_write(const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t T,
                    int64_t Hkv, int64_t D, const int64_t* slot_mapping, int64_t block_size,
                    int64_t num_blocks, float* k_cache, float* v_cache);

}  // namespace qtk
