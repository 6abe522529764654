// A small pool of persistent worker threads with a static, deterministic split.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace qtk {

template <class Signature>
class FunctionRef;

// A non-owning reference to a callable (like std::function_ref of C++26):
// two pointers, no allocation, no copy of the callable. Only valid while the
// callable lives; parallel_for takes it by value and runs it before it
// returns, so a lambda written in the call is fine.
// note: std::function allocated for lambdas capturing more than two
// references (every matmul call did: one malloc per call on the hot path).
template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                              std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): implicit, like std::function
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* obj, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(obj))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

using RangeFn = FunctionRef<void(int64_t begin, int64_t end)>;
using RangeTidFn = FunctionRef<void(int64_t begin, int64_t end, int tid)>;

// note: batch invariance rests on one rule: threads split only over
// independent outputs (rows, columns, heads), never over a reduction. The pool
// therefore only offers a split of an index range into contiguous pieces:
// [0, n) is cut into pieces(n) = min(n, kPiecesPerThread * threads) pieces,
// piece c = [c*n/pieces, (c+1)*n/pieces), and the workers (the caller
// included) claim pieces in order until none is left. Which worker computes
// an output changes from call to call; how it is computed never does.
// note: pieces are claimed, not assigned, because this runs on shared,
// oversubscribed machines: with a fixed split a descheduled worker stalls the
// whole call for a scheduler time slice, with claiming the caller takes its
// pieces and waits only for a piece already under way.
// note: 8 pieces per thread (was 4): a piece claimed by a worker that is then
// descheduled, or still running when the other worker is done, holds up
// the whole call, and smaller pieces bound that. Measured (Qwen3-0.6B decode,
// 1 sequence, 2 threads, alternating runs): equal when the box is quiet
// (20.1-21.7 tok/s), 18.5-20.8 against 11.3-14.3 tok/s with a compile
// running beside it. Claiming a piece is one compare-and-swap.
class ThreadPool {
 public:
  static constexpr int64_t kPiecesPerThread = 8;

  // threads >= 1; the calling thread is worker 0, so threads - 1 are spawned.
  // With pin = true, worker i is pinned to the i-th CPU of the process's
  // affinity mask (best effort: failures are ignored).
  explicit ThreadPool(int threads, bool pin = false);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }

  // Calls fn(begin, end) on the pieces of [0, n) (see above), and returns
  // when all are done. Not re-entrant: fn must not call parallel_for on the
  // same pool.
  void parallel_for(int64_t n, RangeFn fn);

  // Same, also passing the index of the worker running the piece (0 <= tid <
  // size()); one worker runs its pieces one after another, so fn can use
  // per-worker scratch memory.
  void parallel_for_tid(int64_t n, RangeTidFn fn);

 private:
  void worker_loop(int tid);
  // Claims and runs pieces of job `generation` until none is left.
  void run_pieces(uint32_t generation, int tid);

  int threads_;
  std::vector<std::thread> workers_;
  // note: workers spin briefly on generation_ before sleeping on the
  // condition variable, because a decode step issues hundreds of small kernel
  // calls and a futex wake-up per call would cost more than the work.
  std::mutex mutex_;
  std::condition_variable start_cv_;
  // The current job. Written by the caller only while no piece of the
  // previous job can still be claimed.
  std::atomic<const RangeTidFn*> job_{nullptr};
  std::atomic<int64_t> job_n_{0};
  // (job generation << 32) | its number of pieces.
  // note: tagged with the generation because the caller writes the next
  // job's fields while claim_ still holds the finished job's last value
  // (generation, pieces): a worker that read that value and then this
  // field's next-job count (larger) used to pass the piece < pieces check
  // and win the compare-and-swap on the old generation. It then ran a piece
  // of the next job that another thread ran as well (a recurrent-state
  // update applied twice) and counted it in done_, so parallel_for could
  // return while a piece was still running, or, with job_ read later, run
  // a finished job's function on its dead stack frame.
  std::atomic<uint64_t> job_pieces_{0};
  // (job generation << 32) | next unclaimed piece: one compare-and-swap
  // claims a piece of exactly that job, so a worker that wakes up late can
  // never run a piece of a job that has finished, provided the piece was
  // checked against the piece count of that same generation.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};  // pieces of the current job finished
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;  // first exception thrown by a piece (under mutex_)
};

#ifdef QTK_THREAD_POOL_TEST_HOOKS
// Test builds only (tests/kernels/thread_pool_race_test.cpp compiles
// thread_pool.cpp with this defined; the library never is): called at the
// points of the claim protocol where one thread's view of the job can be
// stale, so that a test can hold a thread there while the other goes on.
namespace pool_test {
enum class Point {
  kClaimRead,  // a thread read claim_ = (generation, piece) and will check the piece
  kLeft,       // a worker's run_pieces(generation) returned: no piece left for it
  kPublished,  // the caller wrote job `generation`'s fields (piece = its pieces)
               // and has not opened claim_ yet
};
extern void (*hook)(Point point, int tid, uint32_t generation, int64_t piece);
}  // namespace pool_test
#endif

// Runs fn over [0, n) on the pool, or inline (one piece) when pool is null.
inline void parallel_for(ThreadPool* pool, int64_t n, RangeFn fn) {
  if (n <= 0) return;
  if (pool == nullptr || pool->size() == 1) {
    fn(0, n);
  } else {
    pool->parallel_for(n, fn);
  }
}

inline void parallel_for_tid(ThreadPool* pool, int64_t n, RangeTidFn fn) {
  if (n <= 0) return;
  if (pool == nullptr || pool->size() == 1) {
    fn(0, n, 0);
  } else {
    pool->parallel_for_tid(n, fn);
  }
}

inline int pool_size(const ThreadPool* pool) { return pool == nullptr ? 1 : pool->size(); }

}  // namespace qtk
