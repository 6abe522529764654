// The ranks of a tensor-parallel model inside one process, each running in a
// thread of its own: the barrier they meet at, the host all-reduce of the
// CPU backend's ranks, and the way one rank's failure stops the others.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace qtk {

class RankGroup {
 public:
  explicit RankGroup(int size);
  int size() const { return size_; }

  // Called by every rank with its buffer of n floats: on return every rank's
  // buffer holds the sum of all of them, added in rank order 0..size-1 in
  // float32 (((b0 + b1) + b2) + ...), the same bits on every rank.
  void all_reduce_sum(int rank, float* buf, int64_t n);

  // Blocks until every rank has called it. Throws qtk::Error once the group
  // was aborted.
  void barrier();

  // Wakes every rank waiting in the group and makes every later call throw:
  // a rank failed, and the others must not wait for it forever.
  void abort();

 private:
  const int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<const float*> bufs_;        // [size] each rank's buffer in this reduce
  std::vector<std::vector<float>> sums_;  // [size] each rank's copy of the sum
};

}  // namespace qtk
