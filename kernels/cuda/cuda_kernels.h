// Host-callable launchers of the CUDA kernels. Every function takes device
// pointers, sizes, strides (in elements) and a stream; none allocates, none
// synchronizes, so a step built from them can be captured in a CUDA graph.
//
// Activation type T is float (--precision f32) or __nv_bfloat16 (--precision
// bf16); the templates are instantiated for exactly these two. Arithmetic is
// always float32; small parameter vectors (norm weights, conv weights, gates,
// the GDN state) are float32 in both precisions.
//
// note: batch invariance. Every kernel launches a block size that depends only
// on the shape of one row (never on the number of rows, sequences or blocks),
// and each output element is reduced by one block in a fixed order, so row r
// of a call is bit-identical whatever else is in the batch. The order of each
// reduction is written at the kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace qtk::cuda {

using bf16 = __nv_bfloat16;

// ---- norms ---------------------------------------------------------------

// y = x * rsqrt(mean(x^2) + eps) * w, per row. w f32 [cols] (Qwen3.5's 1+w is
// folded into the pack). In place (y == x) is allowed.
template <class T>
void rmsnorm(const T* x, int64_t ldx, const float* w, T* y, int64_t ldy, int64_t rows, int64_t cols,
             float eps, cudaStream_t stream);

// residual += x (rounded to T), then y = rmsnorm(residual) * w. The fused
// "add, then norm" between two sublayers.
template <class T>
void add_rmsnorm(T* residual, int64_t ldr, const T* x, int64_t ldx, const float* w, T* y,
                 int64_t ldy, int64_t rows, int64_t cols, float eps, cudaStream_t stream);

// GDN output norm: y = w * x * rsqrt(mean(x^2) + eps) * silu(z), per (token,
// head) row of head_dim values. x, z, y: [tokens, heads*head_dim] with token
// strides ldx, ldz, ldy. w f32 [head_dim] (plain w, no +1).
template <class T>
void gated_rmsnorm(const T* x, int64_t ldx, const T* z, int64_t ldz, const float* w, T* y,
                   int64_t ldy, int64_t tokens, int64_t heads, int64_t head_dim, float eps,
                   cudaStream_t stream);

// In place: x = x * rsqrt(sum(x^2) + eps) * scale per (token, head) row
// (transformers' l2norm, eps 1e-6, with the caller's Dk^-0.5 for q).
template <class T>
void l2norm_heads(T* x, int64_t ld, int64_t tokens, int64_t heads, int64_t head_dim, float eps,
                  float scale, cudaStream_t stream);

// ---- rotary embedding fused with the per-head q/k norm ---------------------

struct RopeParams {
  int64_t rotary_dim = 0;       // dims 0..rotary_dim-1 rotate (rotate_half pairs i, i+rd/2)
  double theta = 10000.0;       // inv_freq[j] = theta^(-2j/rotary_dim)
  int sections[3] = {0, 0, 0};  // M-RoPE sections (t, h, w) in frequency pairs
  int n_sections = 0;           // 0: plain RoPE (positions axis 0 only)
  bool interleaved = false;     // Qwen3.5 layout (j%3 picks the axis) vs contiguous
  // Optional: (cos, sin) of position p and frequency j at table[p * rotary_dim/2 + j] for
  // p < table_positions, built by rope_table_build (same values as computed inline).
  const float2* table = nullptr;
  int64_t table_positions = 0;
};

// Fills table f32x2 [positions, rotary_dim / 2] with the (cos, sin) pairs the
// RoPE kernels would compute for positions 0..positions-1.
// note: the kernels compute inv_freq with a double pow and cos/sin with a
// double sincos per element (exactness, see below); at decode that double
// math was most of qkv_rope_cache's time. The table holds the same floats,
// computed by the same device code, so using it changes no result.
void rope_table_build(float2* table, int64_t positions, const RopeParams& rope,
                      cudaStream_t stream);

// In place on x [tokens, heads, head_dim] (token stride ld): optional per-head
// RMSNorm with weight norm_w f32 [head_dim] (nullptr: no norm), then RoPE.
// positions int32 [3][tokens] (axis-major; plain RoPE reads axis 0 only).
// note: exactly the CPU kernel's arithmetic (kernels/rope.h): inv_freq and the
// angle in float32 as transformers computes them (inv_freq float32, never rounded
// to the weights' dtype), cos/sin of that angle in double rounded to float, the rotation in
// double with one rounding per output.
template <class T>
void qk_norm_rope(T* x, int64_t ld, int64_t tokens, int64_t heads, int64_t head_dim,
                  const float* norm_w, float eps, const int32_t* positions, const RopeParams& rope,
                  cudaStream_t stream);

// The attention input of a fused qkv row [tokens, (hq + 2*hkv) * head_dim]
// (stride ld), in one launch: qk_norm_rope of the q heads (q_norm_w) and of
// the k heads (k_norm_w), then kv_cache_write of the k and v heads
// (slot_mapping int64 [tokens], -1 = write nothing; caches [blocks,
// block_size, hkv, head_dim]). Bit-identical to the three separate calls.
template <class T>
void qkv_rope_cache(T* qkv, int64_t ld, int64_t tokens, int64_t hq, int64_t hkv, int64_t head_dim,
                    const float* q_norm_w, const float* k_norm_w, float eps,
                    const int32_t* positions, const RopeParams& rope, const int64_t* slot_mapping,
                    T* k_cache, T* v_cache, cudaStream_t stream);

// ---- elementwise -----------------------------------------------------------

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]; gate_up [T, 2I] stride ld.
template <class T>
void swiglu(const T* gate_up, int64_t ld, T* out, int64_t ldo, int64_t tokens, int64_t inter,
            cudaStream_t stream);

// x[r, c] *= sigmoid(gate[r, c]) (Qwen3.5's gated attention output).
template <class T>
void sigmoid_mul(T* x, int64_t ldx, const T* gate, int64_t ldg, int64_t rows, int64_t cols,
                 cudaStream_t stream);

// g = A * softplus(a + dt_bias) (softplus(x) = x for x > 20, like torch),
// beta = sigmoid(b). a, b: [tokens, Hv] strides lda, ldb; A (= -exp(A_log)),
// dt_bias f32 [Hv]; g, beta f32 [tokens, Hv] contiguous.
template <class T>
void gdn_gates(const T* a, int64_t lda, const T* b, int64_t ldb, const float* A,
               const float* dt_bias, float* g, float* beta, int64_t tokens, int64_t hv,
               cudaStream_t stream);

// out[i, :] = table[ids[i], :]; table BF16 or F32 [vocab, hidden]. With
// feed (device, [n]): row i with feed[i] = r >= 0 takes id fed_ids[r]
// instead (a pipelined step's token from the step before: runtime/model.h,
// StepBatch::feed).
template <class T>
void embedding_lookup(const void* table, DType table_type, int64_t hidden, const int32_t* ids,
                      int64_t n, T* out, int64_t ldo, cudaStream_t stream,
                      const int32_t* feed = nullptr, const int32_t* fed_ids = nullptr);

// Per row: the index of the largest logit (ties to the lowest id) and
// margin = top1 - top2 logit; a row with a NaN or infinite logit gets a NaN
// margin and the argmax of its finite logits (0 when none is finite), as
// kernels/argmax.h on the host. logits f32 [rows, vocab] stride ld. work:
// nullptr (one block per row), or argmax_work_bytes(rows) bytes of device
// memory that lets small batches spread each row over several blocks (the
// same results).
void argmax_rows(const float* logits, int64_t ld, int64_t rows, int64_t vocab, int32_t* ids,
                 float* margin, cudaStream_t stream, void* work = nullptr);
int64_t argmax_work_bytes(int64_t rows);

// Element conversions (uploads, bf16 <-> f32 activations).
void convert_f32_to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t stream);
void convert_bf16_to_f32(const bf16* x, float* y, int64_t n, cudaStream_t stream);

// ---- varlen batches --------------------------------------------------------

// A step's sequences, all arrays in device memory. Sequence s owns query rows
// q_start[s] .. q_start[s+1]-1 (its new tokens this step); after the step its
// cache holds seq_len[s] tokens, so query row i of s sits at position
// seq_len[s] - q_len + i and attends to positions <= that.
struct AttentionBatch {
  int64_t num_seqs = 0;
  const int32_t* q_start = nullptr;      // [num_seqs + 1]
  const int32_t* seq_len = nullptr;      // [num_seqs]
  const int32_t* block_table = nullptr;  // [num_seqs, max_blocks] physical block ids
  int64_t max_blocks = 0;
  int64_t block_size = 0;
  int64_t total_tokens = 0;  // q_start[num_seqs], known on the host
  int64_t max_seq_len = 0;   // bound on seq_len[s] (host), sizes shared memory
  // Optional workspace (bf16 tensor-core path): f32, attention_partials_floats
  // (partial_rows, D) floats. With it, a decode step (one token per sequence)
  // whose contexts fit kAttentionSplitTiles key tiles spreads each row's
  // tiles over blocks; the values are the same as without it.
  float* partials = nullptr;
  int64_t partial_rows = 0;  // capacity in (token, query head) rows
  // decode_attention's form where both apply (the same bits; tests and
  // measurement): by the batch (kAuto), or the split / the walk forced.
  enum class DecodeForm : int8_t { kAuto, kSplit, kWalk };
  DecodeForm decode_form = DecodeForm::kAuto;
};

// Key tiles (of 64) a decode row may be split into, and the workspace size.
// note: 32 tiles (contexts up to 2048 keys). A longer context walks its
// tiles in one block per (sequence, kv head), which at batch 1 leaves most
// SMs idle: H100, Hq/Hkv 16/8, D 128, batch 1, 1024 keys took 73.5 us per
// layer walked with 8 tiles as the limit. The workspace costs
// rows x 32 x (D + 2) floats (Qwen3-0.6B, 256 sequences: 136 MB).
constexpr int64_t kAttentionSplitTiles = 32;
inline int64_t attention_partials_floats(int64_t rows, int64_t head_dim) {
  return rows * kAttentionSplitTiles * (head_dim + 2);
}

// Longest context whose scores paged_attention holds in shared memory at
// once; longer ones are walked in tiles of it (the same bits, two passes over
// the keys), and decode steps beyond it run without a captured graph.
int64_t paged_attention_max_context();

// k_cache/v_cache [num_blocks, block_size, Hkv, D]; slot = block*block_size +
// offset per token (int64 [tokens]). k, v rows: [tokens, Hkv*D] strides ldk, ldv.
template <class T>
void kv_cache_write(const T* k, int64_t ldk, const T* v, int64_t ldv, int64_t tokens, int64_t hkv,
                    int64_t d, const int64_t* slot_mapping, T* k_cache, T* v_cache,
                    cudaStream_t stream);

// Causal paged attention, prefill chunks and decode tokens in one launch.
// q [tokens, Hq, D] stride ldq; out [tokens, Hq, D] stride ldo; GQA maps query
// head h to kv head h / (Hq/Hkv). D in {64, 128, 256} (any multiple of 32 up
// to 256 works). One block per (query row, head); exact two-pass softmax:
// scores in shared memory, max, sum of exp, weighted V sum in key order.
template <class T>
void paged_attention(const T* q, int64_t ldq, const T* k_cache, const T* v_cache, T* out,
                     int64_t ldo, const AttentionBatch& b, int64_t hq, int64_t hkv, int64_t d,
                     float scale, cudaStream_t stream);

// The decode step's attention from the raw projections, in one launch where
// it applies: q_norm + RoPE of the query heads, k_norm + RoPE of the step's
// key, the K/V cache write of the step's key and value, the attention, and
// optionally the sigmoid output gate. Bit for bit the result of qk_norm_rope
// (q, then k) + kv_cache_write + paged_attention (+ sigmoid_mul on out), or
// of qkv_rope_cache + paged_attention (tests/cuda/test_attention.cpp).
// Applies (returns true) only to bf16 decode steps that paged_attention
// would split over key tiles (AttentionBatch::partials given, one token per
// sequence, contexts within kAttentionSplitTiles tiles), head_dim 64, 128 or
// 256, GQA group <= 16, and RoPE whose rotate_half pairs sit in one lane
// (rotary_dim / 2 a multiple of 32); otherwise returns false having launched
// nothing, and the caller runs the separate kernels. The q and k buffers are
// left as they were (unlike qk_norm_rope's in-place result).
struct DecodeAttentionInput {
  const bf16* q = nullptr;  // bf16 [tokens, Hq * D] raw query heads (row stride ldq)
  const bf16* k = nullptr;  // bf16 [tokens, Hkv * D] raw key heads (ldk)
  const bf16* v = nullptr;  // bf16 [tokens, Hkv * D] value heads (ldv)
  int64_t ldq = 0, ldk = 0, ldv = 0;
  const float* q_norm = nullptr;  // f32 [D], or null: no query norm
  const float* k_norm = nullptr;  // f32 [D], or null: no key norm
  float eps = 1e-6f;
  const int32_t* positions = nullptr;     // [3][tokens] (axis 0 only without M-RoPE)
  RopeParams rope;                        // as for qk_norm_rope
  const int64_t* slot_mapping = nullptr;  // [tokens] cache slots; < 0: write nothing
  const bf16* gate = nullptr;             // optional: out *= sigmoid(gate), bf16 [tokens, Hq * D]
  int64_t ldg = 0;
};
bool decode_attention(const DecodeAttentionInput& in, bf16* k_cache, bf16* v_cache, bf16* out,
                      int64_t ldo, const AttentionBatch& b, int64_t hq, int64_t hkv, int64_t d,
                      float scale, cudaStream_t stream);
// True when decode_attention (where it applies) runs a step of this shape as
// the walk: one block per (sequence, kv head) computing every key tile and
// the merge, instead of a block per key tile plus a merge launch (contexts
// within 2 tiles, or within 8 tiles with as many blocks as half the SMs up
// to 4 blocks an SM (past one an SM only for head_dim <= 128), or as
// b.decode_form says; kernels/cuda/attention_mma.cu). The same bits either
// way.
bool decode_attention_walks(const AttentionBatch& b, int64_t hq, int64_t hkv, int64_t d);

// Causal depthwise conv1d over a varlen batch, continuing each sequence from
// its state and updating the state in place (prefill chunk and one-token
// decode alike). x, y: [tokens, C] strides ldx, ldy (y may not alias x);
// w f32 [C, K]; state_pool f32 [slots, C, K-1] oldest first; slot int32
// [num_seqs]; q_start int32 [num_seqs+1]. y = silu(conv) when apply_silu.
// max_run: the most tokens any sequence has in this step (known on the host);
// up to kConvShortRunMax the outputs and the new state come from one launch
// (decode steps), else from two. Same bits either way.
constexpr int64_t kConvShortRunMax = 16;
template <class T>
void causal_conv1d(const T* x, int64_t ldx, T* y, int64_t ldy, int64_t channels, const float* w,
                   int64_t kernel, float* state_pool, const int32_t* slot, const int32_t* q_start,
                   int64_t num_seqs, int64_t tokens, int64_t max_run, bool apply_silu,
                   cudaStream_t stream);

// Gated delta rule, recurrent form over a varlen batch (prefill chunks and
// decode tokens in one launch), updating the f32 state pool in place:
//   S *= exp(g); kv = k^T S; delta = (v - kv) * beta; S += k (x) delta; o = q^T S
// per token, value head h using key head h / (Hv/Hk). q, k [tokens, Hk*Dk]
// (already l2-normalised, q scaled), v [tokens, Hv*Dv], strides ldq/ldk/ldv;
// g, beta f32 [tokens, Hv]; state_pool f32 [slots, Hv, Dk, Dv]; out [tokens,
// Hv*Dv] stride ldo. Dk in {16, 32, 64, 128, 256}.
// note: the state goes through f32 memory exactly, so splitting a prompt into
// chunks at any token gives bit-identical outputs and state.
template <class T>
void gated_delta_rule(const T* q, int64_t ldq, const T* k, int64_t ldk, const T* v, int64_t ldv,
                      const float* g, const float* beta, float* state_pool, const int32_t* slot,
                      const int32_t* q_start, int64_t num_seqs, int64_t tokens, T* out, int64_t ldo,
                      int64_t hk, int64_t hv, int64_t dk, int64_t dv, cudaStream_t stream);

// The same from the conv output before the l2norms and from the gates'
// inputs: l2norm_heads of q (scale q_scale) and of k (scale 1), gdn_gates
// and gated_delta_rule in one launch, bit for bit their results (tested);
// q and k are left as they were. A decode step's linear attention: three
// launches per GDN layer fewer.
template <class T>
struct GdnRawInput {
  const T* a = nullptr;  // [tokens, Hv] stride lda: the dt input of gdn_gates
  const T* b = nullptr;  // [tokens, Hv] stride ldb: the beta input
  int64_t lda = 0, ldb = 0;
  const float* A = nullptr;        // f32 [Hv] (= -exp(A_log))
  const float* dt_bias = nullptr;  // f32 [Hv]
  float eps = 1e-6f;               // of both l2norms
  float q_scale = 1.0f;            // q's l2norm scale (Dk^-0.5)
  // Optional, where gdn_norm_fusable(Dv): the gated RMSNorm applied to the
  // outputs (gated_rmsnorm's arithmetic, so its bits): z [tokens, Hv*Dv]
  // stride ldz, norm f32 [Dv].
  const T* z = nullptr;
  int64_t ldz = 0;
  const float* norm = nullptr;
  float norm_eps = 1e-6f;
};
// True when gated_delta_rule_fused can apply the gated norm on this device
// for value heads of dv columns.
bool gdn_norm_fusable(int64_t dv);
template <class T>
void gated_delta_rule_fused(const T* q, int64_t ldq, const T* k, int64_t ldk, const T* v,
                            int64_t ldv, const GdnRawInput<T>& raw, float* state_pool,
                            const int32_t* slot, const int32_t* q_start, int64_t num_seqs,
                            int64_t tokens, T* out, int64_t ldo, int64_t hk, int64_t hv, int64_t dk,
                            int64_t dv, cudaStream_t stream);

}  // namespace qtk::cuda
