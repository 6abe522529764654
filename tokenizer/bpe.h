// Byte-pair encoding of one pre-token, on raw bytes.
//
// note: the ByteLevel pre-tokenizer maps every byte to one printable character
// and BPE then starts from one symbol per character, so starting from one
// symbol per *byte* (each byte's token id) is the same computation without
// building the mapped string. Vocabulary strings are mapped back to bytes once
// at load time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace qtk::bpe {

// (left id, right id) -> (rank, merged id), open addressing.
class MergeTable {
 public:
  struct Entry {
    uint64_t key;    // (uint64(left) << 32) | right; kEmpty when unused
    uint32_t rank;   // index of the merge in tokenizer.json: lower merges first
    int32_t merged;  // id of left+right
  };

  void reserve(size_t count);
  // A later insert of the same pair replaces the earlier one (as in HF).
  void insert(int32_t left, int32_t right, uint32_t rank, int32_t merged);
  const Entry* find(int32_t left, int32_t right) const {
    const uint64_t key = make_key(left, right);
    size_t slot = hash(key);
    for (;;) {
      const Entry& e = slots_[slot];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
      slot = (slot + 1) & mask_;
    }
  }
  size_t size() const { return size_; }
  void prefetch(int32_t left, int32_t right) const {
    __builtin_prefetch(&slots_[hash(make_key(left, right))]);
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t make_key(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  }
  size_t hash(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
  }
  void grow();

  std::vector<Entry> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

// Merges the bytes w[0..n) (n >= 1) starting from byte_ids[byte] and appends
// the resulting ids to out. Picks the lowest-rank pair, leftmost first, until
// no pair merges: the same result as HF's priority-queue implementation.
void merge_word(const MergeTable& merges, const int32_t* byte_ids, const unsigned char* w, size_t n,
                std::vector<int32_t>& out);

// The two strategies merge_word chooses between, exposed for tests:
// a linear scan over a small array, and a heap for long words.
void merge_word_linear(const MergeTable& merges, const int32_t* byte_ids, const unsigned char* w,
                       size_t n, std::vector<int32_t>& out);
void merge_word_heap(const MergeTable& merges, const int32_t* byte_ids, const unsigned char* w,
                     size_t n, std::vector<int32_t>& out);

// Cache of pre-token bytes -> ids, used by one thread at a time.
class WordCache {
 public:
  // note: long pre-tokens (base64, DNA, rulers of '=') cost the most to
  // merge, so they are cached too, up to this size; the arena cap bounds memory.
  static constexpr size_t kMaxWordBytes = 1024;
  static constexpr size_t kMaxArenaBytes = size_t{8} << 20;

  WordCache();
  static uint64_t hash_bytes(const unsigned char* w, size_t n);
  // Appends the cached ids for w and returns true on a hit.
  bool lookup(uint64_t hash, const unsigned char* w, size_t n, std::vector<int32_t>& out) const;
  void insert(uint64_t hash, const unsigned char* w, size_t n, const int32_t* ids, size_t count);
  void clear();

 private:
  struct Slot {
    uint64_t hash;
    uint32_t key_offset;
    uint32_t key_size;  // 0 when the slot is free
    uint32_t ids_offset;
    uint32_t ids_count;
  };
  static constexpr size_t kSlots = size_t{1} << 16;
  static constexpr size_t kMaxEntries = kSlots / 2;  // cleared when full (or the arena is)

  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t entries_ = 0;
};

}  // namespace qtk::bpe
