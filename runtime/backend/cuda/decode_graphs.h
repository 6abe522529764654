// CUDA graphs of the decode step, one per batch bucket.
//
// note: a decode step (one new token per sequence) launches a few hundred
// small kernels; launched one by one, the host's launch cost dominates at
// small batch. The backend pads a decode step to the next power-of-two bucket
// (padding rows write no K/V, use a scratch state slot, and their logits are
// dropped), captures it once per (bucket, block-table width, cache geometry),
// and replays the graph. Only the step's small arrays are copied before each
// replay, into the same device buffer the graph was captured with. The
// kernels are the eager ones, so replayed and eager steps give the same bits.
// QTK_CUDA_GRAPHS=0 turns graphs off (eager launches).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "core/tuning.h"
#include "kernels/cuda/cuda_check.h"

namespace qtk::cuda {

inline bool decode_graphs_enabled() { return tuning().cuda_graphs; }

// Attention's shared memory and its form are chosen by the step's longest
// context; graphs capture a power-of-two bound of it (at least 128: up to
// 128 keys the decode attention walks its tiles in one block per sequence
// and kv head, kernels/cuda/attention_mma.cu).
inline int64_t context_bucket(int64_t len) {
  int64_t b = 128;
  while (b < len) b *= 2;
  return b;
}

inline int64_t decode_bucket(int64_t seqs) {
  int64_t b = 1;
  while (b < seqs) b *= 2;
  return b;
}

class DecodeGraphs {
 public:
  // bucket, block-table width, kv blocks, block size, context bucket,
  // whether the graph ends in the greedy argmax (1) or with the logits (0)
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

  DecodeGraphs() = default;
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;
  ~DecodeGraphs() { clear(); }

  // Runs one decode step for `key`: the first time eagerly (module loads,
  // GEMM plans), the second time captured and replayed, then replayed.
  template <class Body>
  void run(const Key& key, cudaStream_t stream, Body&& body) {
    auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      QTK_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream));
      return;
    }
    if (seen_[key]++ == 0) {
      body();
      return;
    }
    Entry e;
    const auto t0 = std::chrono::steady_clock::now();
    QTK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    body();
    QTK_CUDA_CHECK(cudaStreamEndCapture(stream, &e.graph));
    QTK_CUDA_CHECK(cudaGraphInstantiate(&e.exec, e.graph, 0));
    capture_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++captured_;
    graphs_.emplace(key, e);
    QTK_CUDA_CHECK(cudaGraphLaunch(e.exec, stream));
  }

  // Graphs captured so far (also those dropped since) and the host time
  // their capture and instantiation took (the start-up breakdown).
  int64_t captured() const { return captured_; }
  double capture_seconds() const { return capture_seconds_; }

  // Drops every graph (device buffers they captured were reallocated).
  void clear() {
    for (auto& [k, e] : graphs_) {
      cudaGraphExecDestroy(e.exec);
      cudaGraphDestroy(e.graph);
    }
    graphs_.clear();
    seen_.clear();
  }

 private:
  struct Entry {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
  };
  std::map<Key, Entry> graphs_;
  std::map<Key, int> seen_;
  int64_t captured_ = 0;
  double capture_seconds_ = 0;
};

// A decode step padded to `bucket` sequences (host arrays).
struct PaddedDecode {
  std::vector<int32_t> ids, positions, q_start, seq_len, block_table, state_slot, feed;
  std::vector<int64_t> slot_mapping;
  std::vector<uint8_t> want;
};

// True when every sequence of the step adds exactly one token and wants its
// logits (the shape the decode graphs capture).
template <class StepBatchT>
bool is_decode_step(const StepBatchT& b) {
  if (b.num_tokens != b.num_seqs) return false;
  for (int64_t s = 0; s < b.num_seqs; ++s)
    if (b.q_start[s + 1] - b.q_start[s] != 1 || !b.want_logits[s]) return false;
  return true;
}

// Pads step b to `bucket` sequences; padding sequences hold one token at
// position 0, write no K/V (slot -1), read block table row 0 and use state
// slot `scratch_slot`.
template <class StepBatchT>
StepBatchT pad_decode(const StepBatchT& b, int64_t bucket, int32_t scratch_slot, PaddedDecode& p) {
  const int64_t S = b.num_seqs, mb = b.max_blocks;
  p.ids.assign(b.token_ids, b.token_ids + S);
  p.ids.resize(bucket, 0);
  p.positions.assign(3 * bucket, 0);
  for (int a = 0; a < 3; ++a)
    std::memcpy(&p.positions[a * bucket], b.positions + a * S, S * sizeof(int32_t));
  p.q_start.resize(bucket + 1);
  for (int64_t i = 0; i <= bucket; ++i) p.q_start[i] = static_cast<int32_t>(i);
  p.seq_len.assign(b.seq_len, b.seq_len + S);
  p.seq_len.resize(bucket, 1);
  p.block_table.assign(b.block_table, b.block_table + S * mb);
  for (int64_t i = S; i < bucket; ++i)
    p.block_table.insert(p.block_table.end(), b.block_table, b.block_table + mb);
  p.slot_mapping.assign(b.slot_mapping, b.slot_mapping + S);
  p.slot_mapping.resize(bucket, -1);
  p.state_slot.assign(bucket, scratch_slot);
  if (b.state_slot) std::memcpy(p.state_slot.data(), b.state_slot, S * sizeof(int32_t));
  p.want.assign(bucket, 1);
  if (b.feed != nullptr) {
    p.feed.assign(b.feed, b.feed + S);
    p.feed.resize(bucket, -1);
  }
  StepBatchT q = b;
  q.num_seqs = bucket;
  q.num_tokens = bucket;
  q.token_ids = p.ids.data();
  q.positions = p.positions.data();
  q.q_start = p.q_start.data();
  q.seq_len = p.seq_len.data();
  q.block_table = p.block_table.data();
  q.slot_mapping = p.slot_mapping.data();
  q.state_slot = p.state_slot.data();
  q.want_logits = p.want.data();
  q.num_logits = bucket;
  if (b.feed != nullptr) q.feed = p.feed.data();
  return q;
}

}  // namespace qtk::cuda
