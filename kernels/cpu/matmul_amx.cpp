// AMX matmul path for bf16 weights (compiled with -mamx-tile -mamx-bf16
// -mavx512f -mavx512bw -mavx512vl ...). f16 / f32 weights and every other
// kernel use the avx512 code on this path (kernels/cpu/matmul.cpp).
// note: see matmul_paths.h for why nothing here may be shared with other files:
// this file includes only <immintrin.h> and <cstdint> and keeps all helpers in
// an anonymous namespace.
//
// note: exactness (bf16x3). The avx512 path multiplies f32 activations by bf16
// weights in f32. AMX multiplies bf16 by bf16, so each activation x is split
// into three bf16 parts, hi = bf16(x) (round to nearest even), mid =
// bf16(x - hi), lo = bf16(x - hi - mid). x - hi and (x - hi) - mid are exact
// in f32 and hi + mid + lo == x exactly (24 significant bits = 3 x 8; for
// |x| >= 2^-110, below which x has bits under bf16's smallest step), so each
// product part * w is exact in f32 and the f32 accumulation is the only
// rounding, as on the other paths (with a different, fixed order).
// Exceptions, all far outside what a model produces:
//  - AMX treats bf16 denormals (|v| < 2^-126) as zero and flushes denormal
//    results (DAZ/FTZ, whatever MXCSR says). So a weight with |w| < 2^-126
//    counts as 0, and for |x| < ~2^-103 the lo (then mid) part is dropped:
//    absolute errors below 2^-126 * |w| per term.
//  - |x| > 3.3961e38 (where bf16 rounding would overflow): hi is x truncated
//    instead of rounded, still exact. Non-finite x: hi = x (NaN stays NaN),
//    mid = lo = 0, so inf * w and NaN propagate as in f32.
//
// note: layout. We compute y^T = W x^T: the weights are the A operand, read
// straight from the HF layout [N, K] (a tile row = 32 consecutive k of one
// output column n, stride K * 2 bytes; no repacking). The activations are the
// B operand in the VNNI pair layout, built once per call (amx_pack_x): a B
// tile covers 32 k (16 rows of k-pairs) and 16 columns; column j holds part
// (j % 3) of activation row 5g + j / 3 (5 rows x 3 parts, column 15 is zero).
// The C tile [16 n x 16 columns] f32 then holds the three partial sums of each
// (m, n) separately, and y[m, n] = (c_lo + c_mid) + c_hi.
//
// note: batch invariance. Every tile has the same shape (16 rows x 64 bytes)
// in every call, activations missing from a group and k beyond K are zeros,
// the k blocks run in increasing order, and the three part sums are combined
// in one fixed order. So y[m, n] goes through the same instructions on the
// same numbers whatever M, the other rows in the call, the thread split or
// the tile that holds it; only positions inside tiles differ. The hardware's
// order inside one TDPBF16PS is not the SDM pseudocode's (run 1 on the AMX
// host: last bits differ from the scalar model EmuTiles in 3634 of 4810
// outputs) but it is fixed and the same for every tile position: rows alone
// and in M-row calls, 1-4 threads and column sub-ranges agree bit for bit
// (tests/kernels/matmul_amx_test.cpp, run there).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/matmul_paths.h"

namespace qtk::cpu {

namespace {

constexpr int64_t kTileK = 32;          // bf16 k per tile row
constexpr int64_t kBlockU16 = 16 * 32;  // one packed B tile: 16 rows x 32 bf16
constexpr int kGroupRows = 5;           // activation rows per B tile (x 3 parts)
// note: a chunk of packed activations (1 KiB per group per k block) of at
// most ~1 MiB stays in L2 while the thread's weight columns stream past it;
// weights are read from memory once per chunk, i.e. once per call whenever
// M <= 5 rows x 1 MiB / (K / 32 x 1 KiB) (160 rows at K = 1024).
constexpr int64_t kChunkBytes = int64_t{1} << 20;

// ---- bf16x3 split -----------------------------------------------------------

// f32 bits -> f32 bits rounded to bf16 (round to nearest even), low half 0.
inline __m512i round_bf16(__m512i u) {
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
  return _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
}

// Splits 16 floats; results are f32 bit patterns whose high halves are the
// bf16 parts (low halves zero).
inline void split16(__m512 x, __m512i* hi, __m512i* mid, __m512i* lo) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7F800000);
  __m512i u = _mm512_castps_si512(x);
  __mmask16 finite = _mm512_cmpneq_epi32_mask(_mm512_and_si512(u, exp_mask), exp_mask);
  __m512i h = round_bf16(u);
  // Rounding overflowed to inf (or x is inf/NaN): truncate instead; a NaN
  // keeps its quiet bit so that truncation cannot turn it into inf.
  __mmask16 overflow = _mm512_cmpeq_epi32_mask(_mm512_and_si512(h, exp_mask), exp_mask);
  __m512i trunc = _mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  trunc = _mm512_mask_or_epi32(trunc, nan, trunc, _mm512_set1_epi32(0x00400000));
  h = _mm512_mask_mov_epi32(h, overflow, trunc);
  // note: exact subtractions (see the file comment); non-finite x gets 0 parts.
  __m512 r1 = _mm512_maskz_sub_ps(finite, x, _mm512_castsi512_ps(h));
  __m512i m = round_bf16(_mm512_castps_si512(r1));
  __m512 r2 = _mm512_sub_ps(r1, _mm512_castsi512_ps(m));
  *hi = h;
  *mid = m;
  *lo = round_bf16(_mm512_castps_si512(r2));
}

// Word indices selecting the high halves (the bf16) of 32 f32 lanes held in
// two vectors: result word i = bf16 of element i.
inline __m512i high_half_index() {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(2 * i + 1);
  return _mm512_load_si512(idx);
}

// Packs group g, k block b of the activations into the 16x16-dword B tile.
inline void pack_block(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t g, int64_t b,
                       uint16_t* block, __m512i halves) {
  uint32_t* out = reinterpret_cast<uint32_t*>(block);
  for (int r = 0; r < 16; ++r) _mm512_storeu_si512(out + 16 * r, _mm512_setzero_si512());
  const int64_t k0 = b * kTileK;
  const int64_t kn = K - k0 < kTileK ? K - k0 : kTileK;
  const __mmask16 m_lo = kn >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << kn) - 1u);
  const __mmask16 m_hi = kn <= 16   ? __mmask16(0)
                         : kn >= 32 ? __mmask16(0xFFFF)
                                    : static_cast<__mmask16>((1u << (kn - 16)) - 1u);
  __m512i rows =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(16));
  for (int ml = 0; ml < kGroupRows; ++ml) {
    const int64_t m = g * kGroupRows + ml;
    if (m >= M) break;
    const float* xr = x + m * ldx + k0;
    __m512 a = _mm512_maskz_loadu_ps(m_lo, xr);
    __m512 c = _mm512_maskz_loadu_ps(m_hi, xr + 16);
    __m512i pa[3], pc[3];
    split16(a, &pa[0], &pa[1], &pa[2]);
    split16(c, &pc[0], &pc[1], &pc[2]);
    for (int part = 0; part < 3; ++part) {
      // dword p = (bf16 of k = 2p) | (bf16 of k = 2p + 1) << 16
      __m512i pairs = _mm512_permutex2var_epi16(pa[part], halves, pc[part]);
      _mm512_i32scatter_epi32(out + 3 * ml + part, rows, pairs, 4);
    }
  }
}

// ---- tiles ------------------------------------------------------------------

// note: tile numbers: C(i, j) = 2i + j (i: n tile, j: group), A(i) = 4 + i,
// B(j) = 6 + j. Every tile is configured 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// note: own inline asm instead of the <amxtileintrin.h> macros: those take
// the tile number as a pasted token (no template parameter) and, in GCC 12,
// do not tell the compiler that tileloadd reads and tilestored writes memory.
// The "memory" clobbers keep stores to packed and scratch buffers before the
// loads, and reads of the stored C tile after the store.
struct HwTiles {
  void configure() {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.colsb[t] = 64;
      cfg.rows[t] = 16;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
  }
  void release() { __asm__ volatile("tilerelease" ::: "memory"); }
  template <int T>
  void zero() {
    __asm__ volatile("tilezero %%tmm%c0" ::"i"(T));
  }
  template <int T>
  void load(const void* base, int64_t stride) {
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(T) : "memory");
  }
  template <int T>
  void store(void* base, int64_t stride) {
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(T) : "memory");
  }
  template <int C, int A, int B>
  void dp() {
    __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
  }
};

// Scalar model of the same instructions, following the pseudocode of the
// Intel SDM for TDPBF16PS (per C element: k pairs in increasing order, even
// element then odd, each product added with one f32 rounding; bf16 denormal
// inputs read as 0, denormal results flushed). Lets the tiling, packing and
// tails be tested on CPUs without AMX; the real instruction's internal order
// may differ (the tests report whether it does, they do not require it).
struct EmuTiles {
  alignas(64) uint8_t t[8][1024];

  static float bf16_value(uint16_t h) {
    if ((h & 0x7F80) == 0) h &= 0x8000;  // DAZ
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }
  static float ftz(float f) {
    uint32_t bits;
    __builtin_memcpy(&bits, &f, 4);
    if ((bits & 0x7F800000u) == 0) bits &= 0x80000000u;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }
  void configure() {}
  void release() {}
  template <int T>
  void zero() {
    for (auto& b : t[T]) b = 0;
  }
  template <int T>
  void load(const void* base, int64_t stride) {
    for (int r = 0; r < 16; ++r) {
      __builtin_memcpy(t[T] + 64 * r, static_cast<const uint8_t*>(base) + r * stride, 64);
    }
  }
  template <int T>
  void store(void* base, int64_t stride) {
    for (int r = 0; r < 16; ++r) {
      __builtin_memcpy(static_cast<uint8_t*>(base) + r * stride, t[T] + 64 * r, 64);
    }
  }
  template <int C, int A, int B>
  void dp() {
    float c[16][16];
    uint16_t a[16][32], b[16][32];
    __builtin_memcpy(c, t[C], 1024);
    __builtin_memcpy(a, t[A], 1024);
    __builtin_memcpy(b, t[B], 1024);
    for (int m = 0; m < 16; ++m) {
      for (int k = 0; k < 16; ++k) {
        for (int n = 0; n < 16; ++n) {
          c[m][n] = ftz(c[m][n] + bf16_value(a[m][2 * k]) * bf16_value(b[k][2 * n]));
          c[m][n] = ftz(c[m][n] + bf16_value(a[m][2 * k + 1]) * bf16_value(b[k][2 * n + 1]));
        }
      }
    }
    __builtin_memcpy(t[C], c, 1024);
  }
};

// ---- kernel -----------------------------------------------------------------

// Where the A operand of n tile i comes from: its 16 rows at `rows` with
// `stride` bytes between rows, `blocks` whole k blocks there; when K % 32 != 0
// and `tail` is set, the last k block comes from `tail` (16 x 32, stride 64).
struct ASource {
  const uint16_t* rows;
  int64_t stride;
  int64_t blocks;
  const uint16_t* tail;
};

// Software prefetch of weight rows during the first pass over a column block
// (mode, see amx_prefetch_mode in matmul_paths.h). `next` is the next
// block's first row (its 16 * NT rows are contiguous), or null.
struct Prefetch {
  int mode;
  const char* next;
  int64_t stride;  // bytes between weight rows
};

template <int NT>
inline void prefetch_step(const Prefetch& pf, const ASource* a, int64_t kb, int64_t blocks) {
  constexpr int kRows = 16 * NT;
  if (pf.mode == 1 && pf.next != nullptr) {
    // note: the next block's rows at this k offset, into L2: short rows
    // (2-6 KiB) end before the hardware prefetcher ramps up.
    for (int r = 0; r < kRows; ++r) _mm_prefetch(pf.next + r * pf.stride + kb * 64, _MM_HINT_T1);
  } else if ((pf.mode == 2 || pf.mode == 3) && pf.next != nullptr) {
    // The next block in address order (one contiguous run of rows), spread
    // evenly over the k blocks; mode 3 touches every 4th line only and
    // leaves the rest to the hardware streamer.
    const int64_t lines = kRows * pf.stride / 64;
    const int64_t per = (lines + blocks - 1) / blocks;
    const int step = pf.mode == 2 ? 1 : 4;
    for (int64_t l = kb * per; l < (kb + 1) * per && l < lines; l += step) {
      _mm_prefetch(pf.next + l * 64, _MM_HINT_T1);
    }
  } else if (pf.mode == 4) {
    // This block's own rows 8 k blocks (512 bytes) ahead, into L1.
    for (int i = 0; i < NT; ++i) {
      const char* base = reinterpret_cast<const char*>(a[i].rows + (kb + 8) * kTileK);
      for (int r = 0; r < 16; ++r) _mm_prefetch(base + r * a[i].stride, _MM_HINT_T0);
    }
  }
}

// C tiles for NT n tiles x MT groups over all k blocks; results to c_out.
template <class Tiles, int NT, int MT>
void tile_block(Tiles& t, const ASource* a, const uint16_t* const* b, const Prefetch& pf,
                float (*c_out)[256]) {
  t.template zero<0>();
  if constexpr (MT == 2) t.template zero<1>();
  if constexpr (NT == 2) t.template zero<2>();
  if constexpr (NT == 2 && MT == 2) t.template zero<3>();
  // k block kb: the A tiles from the weight rows (or, for the K tail, from
  // the zero-padded tail copies at stride 64), the packed B blocks, and the
  // products into the C tiles.
  auto step = [&](int64_t kb, bool tail) {
    t.template load<4>(tail ? a[0].tail : a[0].rows + kb * kTileK, tail ? 64 : a[0].stride);
    if constexpr (NT == 2)
      t.template load<5>(tail ? a[1].tail : a[1].rows + kb * kTileK, tail ? 64 : a[1].stride);
    t.template load<6>(b[0] + kb * kBlockU16, 64);
    if constexpr (MT == 2) t.template load<7>(b[1] + kb * kBlockU16, 64);
    t.template dp<0, 4, 6>();
    if constexpr (MT == 2) t.template dp<1, 4, 7>();
    if constexpr (NT == 2) t.template dp<2, 5, 6>();
    if constexpr (NT == 2 && MT == 2) t.template dp<3, 5, 7>();
  };
  const int64_t blocks = a[0].blocks;
  for (int64_t kb = 0; kb < blocks; ++kb) {
    if (pf.mode != 0) prefetch_step<NT>(pf, a, kb, blocks);
    step(kb, false);
  }
  if (a[0].tail != nullptr) step(blocks, true);
  t.template store<0>(c_out[0], 64);
  if constexpr (MT == 2) t.template store<1>(c_out[1], 64);
  if constexpr (NT == 2) t.template store<2>(c_out[2], 64);
  if constexpr (NT == 2 && MT == 2) t.template store<3>(c_out[3], 64);
}

// y[m, n] for the rows of group g and the n_count columns from n0 of C tile c.
inline void write_tile(const float* c, int64_t g, int64_t M, int64_t n0, int64_t n_count, float* y,
                       int64_t ldy) {
  for (int ml = 0; ml < kGroupRows; ++ml) {
    const int64_t m = g * kGroupRows + ml;
    if (m >= M) break;
    float* yr = y + m * ldy + n0;
    for (int64_t r = 0; r < n_count; ++r) {
      const float* cr = c + r * 16 + 3 * ml;
      // note: fixed combination order: (lo + mid) + hi.
      yr[r] = (cr[2] + cr[1]) + cr[0];
    }
  }
}

template <class Tiles, int NT>
void n_block(Tiles& t, const ASource* a, const uint16_t* packed, int64_t k_blocks, int64_t M,
             int64_t g_begin, int64_t g_end, int64_t n0, int64_t n_count, float* y, int64_t ldy,
             Prefetch pf) {
  alignas(64) float c[4][256];
  const int64_t group_u16 = k_blocks * kBlockU16;
  for (int64_t g = g_begin; g < g_end; g += 2) {
    const uint16_t* b[2] = {packed + g * group_u16, packed + (g + 1) * group_u16};
    if (g + 1 < g_end) {
      tile_block<Tiles, NT, 2>(t, a, b, pf, c);
    } else {
      tile_block<Tiles, NT, 1>(t, a, b, pf, c);
    }
    pf.mode = 0;  // later passes find the rows in L2
    const int mt = g + 1 < g_end ? 2 : 1;
    for (int i = 0; i < NT; ++i) {
      const int64_t cols = n_count - 16 * i < 16 ? n_count - 16 * i : 16;
      for (int j = 0; j < mt; ++j) {
        write_tile(c[(NT == 2 ? 2 * i : 0) + j], g + j, M, n0 + 16 * i, cols, y, ldy);
      }
    }
  }
}

// K tail of one n tile read from the weights: 16 rows x (K % 32), zero-padded.
inline void copy_k_tail(const uint16_t* w, int64_t K, int64_t n, uint16_t* tail) {
  const int64_t k0 = (K / kTileK) * kTileK;
  for (int r = 0; r < 16; ++r) {
    for (int64_t k = 0; k < kTileK; ++k) {
      tail[r * kTileK + k] = k0 + k < K ? w[(n + r) * K + k0 + k] : uint16_t{0};
    }
  }
}

template <class Tiles>
void cols(Tiles& t, const uint16_t* packed, int64_t M, int64_t K, const uint16_t* w, float* y,
          int64_t ldy, int64_t n_begin, int64_t n_end, uint16_t* scratch, int prefetch_mode) {
  const int64_t groups = (M + kGroupRows - 1) / kGroupRows;
  const int64_t k_blocks = (K + kTileK - 1) / kTileK;
  const int64_t full_blocks = K / kTileK;
  const bool k_tail = full_blocks != k_blocks;
  const int64_t row_bytes = K * 2;
  int64_t chunk = kChunkBytes / (k_blocks * kBlockU16 * 2);
  chunk = chunk < 2 ? 2 : chunk & ~int64_t{1};
  // Columns past the last whole 16-row tile: copied once, zero-padded to 16
  // rows and to whole k blocks (never reading past the weights).
  const int64_t whole_end = n_begin + ((n_end - n_begin) / 16) * 16;
  const int64_t n_rest = n_end - whole_end;
  if (n_rest > 0) {
    for (int r = 0; r < 16; ++r) {
      for (int64_t k = 0; k < k_blocks * kTileK; ++k) {
        scratch[r * k_blocks * kTileK + k] =
            r < n_rest && k < K ? w[(whole_end + r) * K + k] : uint16_t{0};
      }
    }
  }
  alignas(64) uint16_t tails[2][16 * kTileK];
  t.configure();
  for (int64_t g0 = 0; g0 < groups; g0 += chunk) {
    const int64_t g1 = g0 + chunk < groups ? g0 + chunk : groups;
    for (int64_t n = n_begin; n < whole_end;) {
      const int nt = n + 32 <= whole_end ? 2 : 1;
      ASource a[2];
      for (int i = 0; i < nt; ++i) {
        const int64_t ni = n + 16 * i;
        const uint16_t* tail = nullptr;
        if (k_tail) {
          copy_k_tail(w, K, ni, tails[i]);
          tail = tails[i];
        }
        a[i] = ASource{w + ni * K, row_bytes, full_blocks, tail};
      }
      const int64_t next = n + 16 * nt;
      const Prefetch pf{
          prefetch_mode,
          next + 16 * nt <= whole_end ? reinterpret_cast<const char*>(w + next * K) : nullptr,
          row_bytes};
      if (nt == 2) {
        n_block<Tiles, 2>(t, a, packed, k_blocks, M, g0, g1, n, 32, y, ldy, pf);
      } else {
        n_block<Tiles, 1>(t, a, packed, k_blocks, M, g0, g1, n, 16, y, ldy, pf);
      }
      n += 16 * nt;
    }
    if (n_rest > 0) {
      ASource a{scratch, k_blocks * kTileK * 2, k_blocks, nullptr};
      n_block<Tiles, 1>(t, &a, packed, k_blocks, M, g0, g1, whole_end, n_rest, y, ldy,
                        Prefetch{0, nullptr, 0});
    }
  }
  t.release();
}

}  // namespace

int64_t amx_packed_u16(int64_t M, int64_t K) {
  return ((M + kGroupRows - 1) / kGroupRows) * ((K + kTileK - 1) / kTileK) * kBlockU16;
}

int64_t amx_groups(int64_t M) { return (M + kGroupRows - 1) / kGroupRows; }

int64_t amx_scratch_u16(int64_t K) { return 16 * ((K + kTileK - 1) / kTileK) * kTileK; }

void amx_pack_x(const float* x, int64_t ldx, int64_t M, int64_t K, uint16_t* packed,
                int64_t g_begin, int64_t g_end) {
  const int64_t k_blocks = (K + kTileK - 1) / kTileK;
  const __m512i halves = high_half_index();
  for (int64_t g = g_begin; g < g_end; ++g) {
    for (int64_t b = 0; b < k_blocks; ++b) {
      pack_block(x, ldx, M, K, g, b, packed + (g * k_blocks + b) * kBlockU16, halves);
    }
  }
}

void amx_split_bf16x3(const float* x, int64_t n, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask =
        n - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512i h, m, l;
    split16(_mm512_maskz_loadu_ps(mask, x + i), &h, &m, &l);
    _mm256_mask_storeu_epi16(hi + i, mask, _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
    _mm256_mask_storeu_epi16(mid + i, mask, _mm512_cvtepi32_epi16(_mm512_srli_epi32(m, 16)));
    _mm256_mask_storeu_epi16(lo + i, mask, _mm512_cvtepi32_epi16(_mm512_srli_epi32(l, 16)));
  }
}

void matmul_cols_amx(const uint16_t* packed, int64_t M, int64_t K, const void* w, float* y,
                     int64_t ldy, int64_t n_begin, int64_t n_end, uint16_t* scratch,
                     int prefetch_mode) {
  HwTiles t;
  cols(t, packed, M, K, static_cast<const uint16_t*>(w), y, ldy, n_begin, n_end, scratch,
       prefetch_mode);
}

void matmul_cols_amx_emulated(const uint16_t* packed, int64_t M, int64_t K, const void* w, float* y,
                              int64_t ldy, int64_t n_begin, int64_t n_end, uint16_t* scratch) {
  EmuTiles t;
  cols(t, packed, M, K, static_cast<const uint16_t*>(w), y, ldy, n_begin, n_end, scratch, 1);
}

}  // namespace qtk::cpu
