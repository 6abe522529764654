#include "runtime/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace qtk {

KvCache::KvCache(const CacheSpec& spec, int64_t num_blocks, int64_t block_size, bool storage)
    : num_blocks_(num_blocks), block_size_(block_size) {
  if (num_blocks < 1 || block_size < 1) {
    fail("kv cache: expected at least one block of at least one token, found {} blocks of {}",
         num_blocks, block_size);
  }
  layer_floats_ = num_blocks * block_size * spec.kv_heads * spec.head_dim;
  if (storage) {
    k_.assign(static_cast<size_t>(layer_floats_ * spec.attention_layers), 0.0f);
    v_.assign(static_cast<size_t>(layer_floats_ * spec.attention_layers), 0.0f);
  }
  // note: hand out low block ids first (pop from the back of a descending list).
  free_.resize(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) free_[i] = static_cast<int32_t>(num_blocks - 1 - i);
}

int64_t KvCache::block_bytes(const CacheSpec& spec, int64_t block_size) {
  return 2 * spec.attention_layers * block_size * spec.kv_heads * spec.head_dim *
         static_cast<int64_t>(sizeof(float));
}

int32_t KvCache::allocate() {
  if (free_.empty()) return -1;
  int32_t b = free_.back();
  free_.pop_back();
  return b;
}

void KvCache::release(int32_t block) { free_.push_back(block); }

StatePool::StatePool(int64_t floats_per_slot, int64_t slots, bool storage)
    : floats_(floats_per_slot) {
  if (floats_ <= 0) return;
  if (storage) data_.assign(static_cast<size_t>(floats_ * slots), 0.0f);
  free_.resize(static_cast<size_t>(slots));
  for (int64_t i = 0; i < slots; ++i) free_[i] = static_cast<int32_t>(slots - 1 - i);
}

int32_t StatePool::acquire() {
  if (free_.empty()) return -1;
  int32_t s = free_.back();
  free_.pop_back();
  return s;
}

void StatePool::release(int32_t s) {
  if (s >= 0 && floats_ > 0) free_.push_back(s);
}

}  // namespace qtk
