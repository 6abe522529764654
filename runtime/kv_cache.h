// Paged K/V cache of the full-attention layers, and the per-sequence slots of
// recurrent state (Gated DeltaNet) that live next to it. Both are plain float
// arenas allocated once; the scheduler hands out blocks and slots.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model.h"

namespace qtk {

// note: K and V are stored in float32 although the weights are bf16: the
// goldens are float64 references, and rounding K/V to bf16 would move logits
// by ~1e-3, i.e. flip the near-ties we are required to reproduce exactly.
class KvCache {
 public:
  // storage == false: block bookkeeping only, k()/v() are null (a device
  // model keeps the cache itself).
  KvCache(const CacheSpec& spec, int64_t num_blocks, int64_t block_size, bool storage = true);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  // The cache of attention layer `i` (i counts attention layers only, 0-based):
  //   k(i): f32 [kv_heads, num_blocks, head_dim, block_size]  (keys in the last index)
  //   v(i): f32 [kv_heads, num_blocks, block_size, head_dim]
  // note: K is transposed inside each block (head_dim rows of block_size
  // keys) so that the CPU attention kernel puts 16 consecutive keys in the
  // lanes of one vector: a score is a plain sum over d in increasing order,
  // with no horizontal reduction whose shape could depend on the batch, and
  // each K vector loaded serves every query of the group. V keeps rows of
  // head_dim (p_j * v_j is a vector axpy over d). Both are kv-head-major:
  // one attention task (a sequence and a kv head) reads block_size *
  // head_dim contiguous floats per block, and a sequence's blocks, mostly
  // allocated together with consecutive ids, follow each other, so the
  // task streams contiguous memory (8 KiB pieces 64 KiB apart stream at a
  // third of the sequential bandwidth on Zen 4). kernels/attention.h has
  // the kernel side; the CUDA backend keeps its own device cache.
  float* k(int64_t i) { return k_.empty() ? nullptr : k_.data() + i * layer_floats_; }
  float* v(int64_t i) { return v_.empty() ? nullptr : v_.data() + i * layer_floats_; }
  // Bytes of one block over all attention layers (K and V).
  static int64_t block_bytes(const CacheSpec& spec, int64_t block_size);

  // Block allocator (free list). allocate() returns -1 when none is free.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int32_t allocate();
  void release(int32_t block);

 private:
  int64_t num_blocks_ = 0;
  int64_t block_size_ = 0;
  int64_t layer_floats_ = 0;
  std::vector<float> k_, v_;
  std::vector<int32_t> free_;
};

// Recurrent state of one sequence per slot: spec.state_floats floats, laid
// out by the model (conv state and recurrent state of each GDN layer).
class StatePool {
 public:
  // storage == false: slot bookkeeping only, slot() is null.
  StatePool(int64_t floats_per_slot, int64_t slots, bool storage = true);
  int64_t floats_per_slot() const { return floats_; }
  float* slot(int32_t s) { return data_.empty() ? nullptr : data_.data() + s * floats_; }
  // Takes a free slot. Returns -1 when none is free or the model has no
  // state. note: the backend clears a slot's state when its sequence starts
  // at position 0 (starts_sequence in runtime/model.h), not here: that one
  // rule covers new sequences and preempted ones recomputed from the start,
  // on every backend.
  int32_t acquire();
  void release(int32_t s);

 private:
  int64_t floats_ = 0;
  std::vector<float> data_;
  std::vector<int32_t> free_;
};

}  // namespace qtk
