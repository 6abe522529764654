// A small pool of persistent worker threads with a static, deterministic split.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qtk {

// note: batch invariance rests on one rule: threads split only over
// independent outputs (rows, columns, heads), never over a reduction. The pool
// therefore only offers a contiguous split of an index range: worker i of n
// gets [i*len/n, (i+1)*len/n). Which worker computes an output changes with
// the thread count; how it is computed never does.
class ThreadPool {
 public:
  // threads >= 1; the calling thread is worker 0, so threads - 1 are spawned.
  // With pin = true, worker i is pinned to the i-th CPU of the process's
  // affinity mask (best effort: failures are ignored).
  explicit ThreadPool(int threads, bool pin = false);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }

  // Calls fn(begin, end) on contiguous pieces of [0, n), one per worker (empty
  // pieces are skipped), and returns when all are done. Not re-entrant: fn
  // must not call parallel_for on the same pool.
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

  // Same split, also passing the worker index (0 <= tid < size()) so that fn
  // can use per-worker scratch memory.
  void parallel_for_tid(int64_t n,
                        const std::function<void(int64_t begin, int64_t end, int tid)>& fn);

 private:
  void worker_loop(int tid);
  void run_piece(int tid);

  int threads_;
  std::vector<std::thread> workers_;
  // note: workers spin briefly on generation_ before sleeping on the
  // condition variable, because a decode step issues hundreds of small kernel
  // calls and a futex wake-up per call would cost more than the work.
  std::mutex mutex_;
  std::condition_variable start_cv_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

// Runs fn over [0, n) on the pool, or inline (one piece) when pool is null.
inline void parallel_for(ThreadPool* pool, int64_t n,
                         const std::function<void(int64_t begin, int64_t end)>& fn) {
  if (n <= 0) return;
  if (pool == nullptr || pool->size() == 1) {
    fn(0, n);
  } else {
    pool->parallel_for(n, fn);
  }
}

inline void parallel_for_tid(ThreadPool* pool, int64_t n,
                             const std::function<void(int64_t begin, int64_t end, int tid)>& fn) {
  if (n <= 0) return;
  if (pool == nullptr || pool->size() == 1) {
    fn(0, n, 0);
  } else {
    pool->parallel_for_tid(n, fn);
  }
}

inline int pool_size(const ThreadPool* pool) { return pool == nullptr ? 1 : pool->size(); }

}  // namespace qtk
