#include "tokenizer/bpe.h"

#include <cstring>
#include <queue>

namespace qtk::bpe {

void MergeTable::reserve(size_t count) {
  size_t capacity = 16;
  while (capacity < count * 2) capacity *= 2;  // load factor <= 0.5
  if (capacity <= slots_.size()) return;
  std::vector<Entry> old = std::move(slots_);
  slots_.assign(capacity, Entry{kEmpty, 0, 0});
  mask_ = capacity - 1;
  shift_ = 64 - __builtin_ctzll(capacity);
  size_ = 0;
  for (const Entry& e : old) {
    if (e.key != kEmpty) {
      insert(static_cast<int32_t>(e.key >> 32), static_cast<int32_t>(e.key & 0xFFFFFFFFu), e.rank,
             e.merged);
    }
  }
}

void MergeTable::grow() { reserve(slots_.empty() ? 8 : slots_.size()); }

void MergeTable::insert(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = make_key(left, right);
  size_t slot = hash(key);
  for (;;) {
    Entry& e = slots_[slot];
    if (e.key == key) {
      e.rank = rank;
      e.merged = merged;
      return;
    }
    if (e.key == kEmpty) {
      e = Entry{key, rank, merged};
      ++size_;
      return;
    }
    slot = (slot + 1) & mask_;
  }
}

namespace {
constexpr uint32_t kNoMerge = ~uint32_t{0};
// note: words up to this many bytes use the array scan, O(n^2) but with tiny
// constants; longer ones (rare: base64, DNA, long runs) use the heap, O(n log n).
constexpr size_t kLinearMaxBytes = 64;
}  // namespace

void merge_word_linear(const MergeTable& merges, const int32_t* byte_ids, const unsigned char* w,
                       size_t n, std::vector<int32_t>& out) {
  std::vector<int32_t> ids_storage;
  std::vector<uint32_t> ranks_storage;
  std::vector<int32_t> merged_storage;
  int32_t ids_small[kLinearMaxBytes];
  uint32_t ranks_small[kLinearMaxBytes];
  int32_t merged_small[kLinearMaxBytes];
  int32_t* ids = ids_small;
  uint32_t* ranks = ranks_small;
  int32_t* merged = merged_small;
  if (n > kLinearMaxBytes) {
    ids_storage.resize(n);
    ranks_storage.resize(n);
    merged_storage.resize(n);
    ids = ids_storage.data();
    ranks = ranks_storage.data();
    merged = merged_storage.data();
  }
  auto rank_of = [&](size_t k) {
    const MergeTable::Entry* e = merges.find(ids[k], ids[k + 1]);
    if (e) {
      ranks[k] = e->rank;
      merged[k] = e->merged;
    } else {
      ranks[k] = kNoMerge;
    }
  };
  size_t m = n;
  for (size_t k = 0; k < m; ++k) ids[k] = byte_ids[w[k]];
  for (size_t k = 0; k + 1 < m; ++k) rank_of(k);
  while (m > 1) {
    uint32_t best = kNoMerge;
    size_t at = 0;
    for (size_t k = 0; k + 1 < m; ++k) {
      if (ranks[k] < best) {  // strict: the leftmost of equal ranks wins
        best = ranks[k];
        at = k;
      }
    }
    if (best == kNoMerge) break;
    ids[at] = merged[at];
    // Remove symbol at+1; ranks[k] describes the pair (k, k+1).
    const size_t tail = m - (at + 2);
    std::memmove(ids + at + 1, ids + at + 2, tail * sizeof(int32_t));
    std::memmove(ranks + at + 1, ranks + at + 2, tail * sizeof(uint32_t));
    std::memmove(merged + at + 1, merged + at + 2, tail * sizeof(int32_t));
    --m;
    if (at > 0) rank_of(at - 1);
    if (at + 1 < m) rank_of(at);
  }
  out.insert(out.end(), ids, ids + m);
}

void merge_word_heap(const MergeTable& merges, const int32_t* byte_ids, const unsigned char* w,
                     size_t n, std::vector<int32_t>& out) {
  struct Symbol {
    int32_t id;
    int32_t prev;  // -1 at the start
    int32_t next;  // -1 at the end
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;  // index of the left symbol
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Symbol> sym(n);
  for (size_t k = 0; k < n; ++k) {
    sym[k] = Symbol{byte_ids[w[k]], static_cast<int32_t>(k) - 1,
                    k + 1 < n ? static_cast<int32_t>(k + 1) : -1, true};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (next < 0) return;
    if (const MergeTable::Entry* e = merges.find(sym[pos].id, sym[next].id)) {
      queue.push(Candidate{e->rank, pos, e->merged});
    }
  };
  for (size_t k = 0; k + 1 < n; ++k) push_pair(static_cast<int32_t>(k));
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[left.next];
    // A stale candidate: one of its symbols changed since it was queued.
    const MergeTable::Entry* e = merges.find(left.id, right.id);
    if (!e || e->merged != top.merged) continue;
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (size_t k = 0; k < n; ++k) {
    if (sym[k].alive) out.push_back(sym[k].id);
  }
}

void merge_word(const MergeTable& merges, const int32_t* byte_ids, const unsigned char* w, size_t n,
                std::vector<int32_t>& out) {
  if (n <= kLinearMaxBytes) {
    merge_word_linear(merges, byte_ids, w, n, out);
  } else {
    merge_word_heap(merges, byte_ids, w, n, out);
  }
}

WordCache::WordCache() : slots_(kSlots, Slot{0, 0, 0, 0, 0}) {}

uint64_t WordCache::hash_bytes(const unsigned char* w, size_t n) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ULL;
  uint64_t h = 0x243F6A8885A308D3ULL ^ (n * kMul);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, w + i, 8);
    h = (h ^ v) * kMul;
    h ^= h >> 29;
  }
  if (i < n) {
    uint64_t v = 0;
    std::memcpy(&v, w + i, n - i);
    h = (h ^ v) * kMul;
    h ^= h >> 29;
  }
  h *= kMul;
  return h ^ (h >> 32);
}

bool WordCache::lookup(uint64_t hash, const unsigned char* w, size_t n,
                       std::vector<int32_t>& out) const {
  size_t slot = hash & (kSlots - 1);
  for (;;) {
    const Slot& s = slots_[slot];
    if (s.key_size == 0) return false;
    if (s.hash == hash && s.key_size == n && std::memcmp(keys_.data() + s.key_offset, w, n) == 0) {
      out.insert(out.end(), ids_.begin() + s.ids_offset, ids_.begin() + s.ids_offset + s.ids_count);
      return true;
    }
    slot = (slot + 1) & (kSlots - 1);
  }
}

void WordCache::insert(uint64_t hash, const unsigned char* w, size_t n, const int32_t* ids,
                       size_t count) {
  if (n == 0 || n > kMaxWordBytes) return;
  if (entries_ >= kMaxEntries || keys_.size() + n > kMaxArenaBytes) clear();
  size_t slot = hash & (kSlots - 1);
  while (slots_[slot].key_size != 0) slot = (slot + 1) & (kSlots - 1);
  slots_[slot] = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(n),
                      static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(count)};
  keys_.append(reinterpret_cast<const char*>(w), n);
  ids_.insert(ids_.end(), ids, ids + count);
  ++entries_;
}

void WordCache::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{0, 0, 0, 0, 0});
  keys_.clear();
  ids_.clear();
  entries_ = 0;
}

}  // namespace qtk::bpe
