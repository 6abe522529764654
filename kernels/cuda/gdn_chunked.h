// Gated delta rule in its chunked (WY, "chunk_gated_delta_rule") form on the
// GPU, for prompt tokens in full 64-token chunks anchored at absolute
// positions 0, 64, 128, ... of a prompt (--precision bf16). Every other token
// (a prompt's tail, decode, replayed generated tokens) goes through the
// recurrent kernel (gated_delta_rule in kernels/cuda/cuda_kernels.h), which
// continues from the state this kernel leaves in the pool.
//
// Launchers take device pointers, sizes, strides (in elements) and a stream;
// none allocates or synchronizes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qtk::cuda {

// Tokens per chunk of the chunked form; the scheduler's prefill alignment.
constexpr int64_t kGdnChunk = 64;

// Bytes of device workspace gated_delta_rule_chunked needs for `total_chunks`
// chunks of `hv` value heads at key head dim `dk` (the state-independent
// products of every chunk: ~89 KiB per chunk and head at dk 128). Throws for
// an unsupported dk.
int64_t gdn_chunked_workspace_bytes(int64_t total_chunks, int64_t hv, int64_t dk);

// Runs `count` items; item i is chunk_start[i+1] - chunk_start[i] consecutive
// full chunks of one sequence, token rows first_row[i] .. first_row[i] +
// 64*chunks - 1, continuing from and updating state_pool[slot[i]] in place:
//   q, k bf16 [tokens, Hk*Dk] (l2-normalised, q scaled by Dk^-0.5), v bf16
//   [tokens, Hv*Dv], strides ldq/ldk/ldv; g, beta f32 [tokens, Hv]
//   contiguous; state_pool f32 [slots, Hv, Dk, Dv]; out bf16 [tokens, Hv*Dv]
//   stride ldo.
// Value head h uses key head h / (Hv/Hk). Dk in {16, 32, 64, 128}; any Dv >= 1.
// slot, first_row: int32 [count], chunk_start: int32 [count + 1] (ascending,
// chunk_start[0] = 0), all in device memory; total_chunks =
// chunk_start[count] (host); workspace: gdn_chunked_workspace_bytes(
// total_chunks, hv, dk) bytes of device memory (no contents kept).
// note: the same per-token recurrence as gated_delta_rule, rearranged per
// chunk (the math and the precision of each product are written at the
// kernels); tensor-core products with f32 accumulation and an f32 state. Its
// rounding differs from the recurrent kernel's, so a token must always take
// the same path: the scheduler's alignment rule guarantees that
// (runtime/scheduler.h). Each output element and state element is computed
// in an order fixed by Dk and its chunk alone: bit-identical whatever else is
// in the launch.
void gated_delta_rule_chunked(const __nv_bfloat16* q, int64_t ldq, const __nv_bfloat16* k,
                              int64_t ldk, const __nv_bfloat16* v, int64_t ldv, const float* g,
                              const float* beta, float* state_pool, const int32_t* slot,
                              const int32_t* first_row, const int32_t* chunk_start, int64_t count,
                              int64_t total_chunks, void* workspace, __nv_bfloat16* out,
                              int64_t ldo, int64_t hk, int64_t hv, int64_t dk, int64_t dv,
                              cudaStream_t stream);

// Value columns per block of the state pass for a launch of `count` items
// (16 when 32-column blocks would not fill the GPU's SMs, else 32). Every
// output and state element is computed the same way in both (tests check
// bit equality); exposed so tests can tell which one a launch takes.
int gdn_chunked_state_columns(int64_t count, int64_t hv, int64_t dv);

// dst[dst_rows[i], 0..cols-1] = src[src_rows[i], 0..cols-1] for i < n
// (exact copies; rows int32 [n] in device memory, nullptr = i). Gathers the
// tokens that go through the recurrent kernel into a compact batch and
// scatters its outputs back.
template <class T>
void copy_rows(const T* src, int64_t lds, const int32_t* src_rows, T* dst, int64_t ldd,
               const int32_t* dst_rows, int64_t n, int64_t cols, cudaStream_t stream);

}  // namespace qtk::cuda
