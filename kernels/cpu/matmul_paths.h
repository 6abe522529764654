// Per-path matmul column-range functions (internal to qtk_kernels).
//
// note: each lives in its own translation unit compiled with that path's
// -m flags. Those files include nothing but <immintrin.h> and <cstdint> and
// define everything in an anonymous namespace, so no inline function or
// template built with AVX-512 instructions can be merged by the linker into
// code that runs on a CPU without them.
#pragma once

#include <cstdint>

namespace qtk::cpu {

// Weight element type codes shared by the path files.
enum MatmulWeight : int { kWeightBf16 = 0, kWeightF16 = 1, kWeightF32 = 2 };

// Computes y[m, n] for all m < M and n_begin <= n < n_end.
using MatmulColsFn = void (*)(const float* x, int64_t ldx, const void* w, int wtype, float* y,
                              int64_t ldy, int64_t M, int64_t K, int64_t n_begin, int64_t n_end);

void matmul_cols_scalar(const float* x, int64_t ldx, const void* w, int wtype, float* y,
                        int64_t ldy, int64_t M, int64_t K, int64_t n_begin, int64_t n_end);
void matmul_cols_avx2(const float* x, int64_t ldx, const void* w, int wtype, float* y, int64_t ldy,
                      int64_t M, int64_t K, int64_t n_begin, int64_t n_end);
void matmul_cols_avx512(const float* x, int64_t ldx, const void* w, int wtype, float* y,
                        int64_t ldy, int64_t M, int64_t K, int64_t n_begin, int64_t n_end);

// ---- AMX (bf16 weights only; matmul_amx.cpp) ----
// note: the activations are split and packed once per call into the AMX B
// operand layout (amx_pack_x, by groups of 5 rows, any split of the groups
// over threads), then each thread computes whole column ranges from the packed
// copy (matmul_cols_amx). Layout and exactness: see matmul_amx.cpp.

// bf16 elements of the packed activations of an M x K call.
int64_t amx_packed_u16(int64_t M, int64_t K);
// Groups of activation rows in the packed layout (5 rows each).
int64_t amx_groups(int64_t M);
// bf16 elements of per-thread scratch matmul_cols_amx needs for this K.
int64_t amx_scratch_u16(int64_t K);
// Packs groups [g_begin, g_end) of x (f32 [M, K], row stride ldx). Needs
// AVX-512 F/BW only.
void amx_pack_x(const float* x, int64_t ldx, int64_t M, int64_t K, uint16_t* packed,
                int64_t g_begin, int64_t g_end);
// The bf16x3 split used by amx_pack_x (for tests): x == hi + mid + lo.
// Needs AVX-512 F/BW/VL only.
void amx_split_bf16x3(const float* x, int64_t n, uint16_t* hi, uint16_t* mid, uint16_t* lo);
// y[m, n] for m < M, n_begin <= n < n_end from packed activations and bf16
// weights [N, K]. scratch: amx_scratch_u16(K) elements owned by this thread.
// prefetch_mode: software prefetch of weight rows (changes no arithmetic):
// 0 none, 1 the next column block's rows at the current k offset, 2 the next
// block in address order, 3 the same, every 4th line, 4 the current rows
// 512 bytes ahead (see matmul.cpp for the default and QTK_AMX_PREFETCH).
void matmul_cols_amx(const uint16_t* packed, int64_t M, int64_t K, const void* w, float* y,
                     int64_t ldy, int64_t n_begin, int64_t n_end, uint16_t* scratch,
                     int prefetch_mode);
// The same with the tile instructions modelled in scalar code (tests only:
// checks tiling, packing and tails on CPUs without AMX).
void matmul_cols_amx_emulated(const uint16_t* packed, int64_t M, int64_t K, const void* w, float* y,
                              int64_t ldy, int64_t n_begin, int64_t n_end, uint16_t* scratch);

}  // namespace qtk::cpu
