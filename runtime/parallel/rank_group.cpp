#include "runtime/parallel/rank_group.h"

#include <algorithm>

#include "core/error.h"

namespace qtk {

RankGroup::RankGroup(int size) : size_(size), bufs_(size), sums_(size) {
  if (size < 1) fail("tensor parallel: expected a rank count >= 1, found {}", size);
}

void RankGroup::barrier() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (aborted_) fail("tensor parallel: another rank failed");
  const int64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  if (generation_ == gen) fail("tensor parallel: another rank failed");
}

void RankGroup::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  cv_.notify_all();
}

// note: each rank adds all buffers itself, into a copy of its own, between
// two barriers: no rank overwrites its buffer while another still reads it,
// and every rank performs the same float32 additions in the same order.
void RankGroup::all_reduce_sum(int rank, float* buf, int64_t n) {
  bufs_[rank] = buf;
  barrier();
  std::vector<float>& sum = sums_[rank];
  sum.assign(bufs_[0], bufs_[0] + n);
  for (int r = 1; r < size_; ++r) {
    const float* b = bufs_[r];
    for (int64_t i = 0; i < n; ++i) sum[i] += b[i];
  }
  barrier();
  std::copy(sum.begin(), sum.end(), buf);
}

}  // namespace qtk
