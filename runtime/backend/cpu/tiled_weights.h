// Tile-order copies of a model's bf16 matrices (kernels/matmul_tiled.h) for
// the avx512 path, on transparent huge pages, looked up by the matrix's
// pointer into the pack. Header-only (used by the CPU backend,
// runtime/backend/cpu).
//
// note: the pack keeps the Hugging Face layout: every TensorView stays valid
// and matmul() on it works on any path. The pack's pages of a tiled matrix
// are given back (Pack::release_range) once copied, so the process holds one
// copy of the weights, not two; reading the HF pointer again faults them back
// in from the page cache. QTK_TILED=0 turns tiling off (the pack is then
// copied to huge pages as it is, Pack::load_for_cpu).
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/tensor_view.h"
#include "core/tuning.h"
#include "kernels/cpu_features.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/matmul_fp8.h"
#include "kernels/matmul_tiled.h"
#include "kernels/thread_pool.h"
#include "pack/pack.h"

namespace qtk {

class TiledWeights {
 public:
  TiledWeights() = default;
  ~TiledWeights() {
    if (arena_ != nullptr) ::munmap(arena_, arena_bytes_);
  }
  TiledWeights(const TiledWeights&) = delete;
  TiledWeights& operator=(const TiledWeights&) = delete;

  // True when the active CPU path would use tiled copies and QTK_TILED is
  // not "0".
  static bool enabled() {
    if (!tuning().tiled) return false;
    return active_cpu_path() == CpuPath::kAvx512;
  }

  // Makes tile-order copies of every usable matrix in `mats` (2-D views into
  // `pack` or a tensor-parallel rank's slices; duplicates, e.g. a tied
  // lm_head, are copied once), releases their pages in the pack, and reads
  // every other tensor of the pack in (what prefault() did). When tiling is
  // off (enabled() is false, or the copies would not fit in memory:
  // Pack::anonymous_copy_fits) or no matrix is usable: pack.load_for_cpu()
  // instead. `fp8`: the block scales of the F8_E4M3 matrices of `mats` (the
  // pack's own, or a rank's slices of them), which matmul() reads; the
  // records must outlive this object.
  void build(const Pack& pack, const std::vector<TensorView>& mats,
             const std::vector<const PackFp8Scales*>& fp8, ThreadPool* pool) {
    for (const PackFp8Scales* q : fp8) fp8_[q->weight.data] = q;
    if (const PackTensorInfo* e = pack.find_tensor("embed_tokens");
        e != nullptr && e->view.dtype == DType::F8_E4M3) {
      fail(
          "{}: tensor 'embed_tokens' is F8_E4M3; an FP8 embedding table is not supported "
          "(expected BF16, F16 or F32)",
          pack.path());
    }
    if (!enabled() || !pack.anonymous_copy_fits()) {
      pack.load_for_cpu();
      return;
    }
    std::vector<TensorView> todo;
    int64_t total = 0;
    for (const TensorView& v : mats) {
      if (v.ndim != 2 || !tiled_matmul_usable(CpuPath::kAvx512, v.dtype, v.shape[1])) continue;
      if (offsets_.count(v.data) != 0) continue;
      offsets_[v.data] = total;
      todo.push_back(v);
      // note: each copy starts on a 64-byte line (32 elements).
      total += (tiled_weight_elements(v.shape[0], v.shape[1]) + 31) / 32 * 32;
    }
    if (todo.empty()) {
      pack.load_for_cpu();
      return;
    }
    constexpr size_t kHuge = size_t{2} << 20;
    arena_bytes_ = (static_cast<size_t>(total) * 2 + kHuge - 1) / kHuge * kHuge + kHuge;
    void* raw = ::mmap(nullptr, arena_bytes_, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
      fail("{}: cannot allocate {} bytes for the tile-order weights", pack.path(), arena_bytes_);
    }
    arena_ = static_cast<uint8_t*>(raw);
    // note: the first 2 MiB boundary inside the mapping, so that huge pages
    // cover the copies; a kernel without THP just uses 4 KiB pages.
    uint8_t* aligned = arena_ + (kHuge - reinterpret_cast<uintptr_t>(arena_) % kHuge) % kHuge;
    ::madvise(aligned, static_cast<size_t>(total) * 2, MADV_HUGEPAGE);
    uint16_t* base = reinterpret_cast<uint16_t*>(aligned);
    for (const TensorView& v : todo) {
      const int64_t N = v.shape[0], K = v.shape[1];
      uint16_t* dst = base + offsets_[v.data];
      pack.prefault_range(v.data, static_cast<size_t>(v.nbytes()));
      const uint16_t* src = v.as<uint16_t>();
      parallel_for(pool, tiled_tiles(N), [&](int64_t t0, int64_t t1) {
        tile_weight_bf16(src, N, K, t0 * kTiledRows, std::min(N, t1 * kTiledRows), dst);
      });
      pack.release_range(v.data, static_cast<size_t>(v.nbytes()));
      tiled_[v.data] = dst;
    }
    // Everything not tiled (norm vectors, an untied embedding table, ...).
    for (const PackTensorInfo& t : pack.tensors()) {
      if (tiled_.count(t.view.data) == 0) {
        pack.prefault_range(t.view.data, static_cast<size_t>(t.view.nbytes()));
      }
    }
    bytes_ = static_cast<size_t>(total) * 2;
  }

  // The tile-order copy of the matrix whose pack data is `hf`, or nullptr.
  const uint16_t* find(const void* hf) const {
    auto it = tiled_.find(hf);
    return it == tiled_.end() ? nullptr : it->second;
  }

  // y = x w^T through the tiled copy when w has one, through matmul_fp8 with
  // its block scales (given to build) when w is F8_E4M3, else matmul() (HF).
  // note: FP8 weights are read in place (no tiled or dequantized copy): at
  // one byte per weight the stream is already half of bf16's.
  void matmul(const float* x, int64_t ldx, const TensorView& w, float* y, int64_t ldy, int64_t M,
              int64_t N, int64_t K, ThreadPool* pool) const {
    if (w.dtype == DType::F8_E4M3) {
      const auto it = fp8_.find(w.data);
      if (it == fp8_.end()) fail("internal error: an F8_E4M3 matrix without block scales");
      const PackFp8Scales& q = *it->second;
      matmul_fp8(x, ldx, w.as<uint8_t>(), q.scale.as<float>(), q.block_rows, q.block_cols, y, ldy,
                 M, N, K, pool);
      return;
    }
    if (const uint16_t* wt = find(w.data)) {
      matmul_tiled(x, ldx, wt, y, ldy, M, N, K, pool);
    } else {
      qtk::matmul(x, ldx, w.data, w.dtype, y, ldy, M, N, K, pool);
    }
  }

  // embedding_lookup, from the tiled copy when the table has one (tied).
  void embedding(const TensorView& table, const int32_t* ids, int64_t n, float* out) const {
    if (const uint16_t* wt = find(table.data)) {
      tiled_rows_to_f32(wt, table.shape[1], ids, n, out);
    } else {
      embedding_lookup(table.data, table.dtype, table.shape[1], ids, n, out);
    }
  }

  size_t bytes() const { return bytes_; }

 private:
  uint8_t* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  size_t bytes_ = 0;
  std::unordered_map<const void*, int64_t> offsets_;
  std::unordered_map<const void*, const uint16_t*> tiled_;
  std::unordered_map<const void*, const PackFp8Scales*> fp8_;  // F8_E4M3 matrix -> its scales
};

}  // namespace qtk
