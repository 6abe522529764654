#include "kernels/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <exception>

namespace qtk {

#ifdef QTK_THREAD_POOL_TEST_HOOKS
namespace pool_test {
void (*hook)(Point point, int tid, uint32_t generation, int64_t piece) = nullptr;
}  // namespace pool_test
#define QTK_POOL_TEST_POINT(point, tid, generation, piece)              \
  do {                                                                  \
    if (pool_test::hook != nullptr)                                     \
      pool_test::hook(pool_test::Point::point, tid, generation, piece); \
  } while (false)
#else
#define QTK_POOL_TEST_POINT(point, tid, generation, piece) ((void)0)
#endif

namespace {

// Iterations of the spin phase before a worker sleeps (a few tens of µs).
constexpr int kSpinIterations = 20000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Pins a thread to the index-th CPU of `allowed` (the process's mask, read
// before any thread was pinned: a pinned creator's mask is a single CPU).
void pin_to_nth_cpu(pthread_t handle, int index, const cpu_set_t& allowed) {
  int count = CPU_COUNT(&allowed);
  if (count == 0) return;
  index %= count;
  int seen = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (seen++ == index) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      pthread_setaffinity_np(handle, sizeof(one), &one);  // best effort
      return;
    }
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads, bool pin) : threads_(threads < 1 ? 1 : threads) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (pin && sched_getaffinity(0, sizeof(allowed), &allowed) != 0) pin = false;
  workers_.reserve(threads_ - 1);
  for (int tid = 1; tid < threads_; ++tid) {
    workers_.emplace_back([this, tid] { worker_loop(tid); });
    if (pin) pin_to_nth_cpu(workers_.back().native_handle(), tid, allowed);
  }
  if (pin) pin_to_nth_cpu(pthread_self(), 0, allowed);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_pieces(uint32_t generation, int tid) {
  for (;;) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    int64_t piece = 0, pieces = 0;
    for (;;) {
      if (static_cast<uint32_t>(c >> 32) != generation) return;
      piece = static_cast<int64_t>(c & 0xFFFFFFFFu);
      QTK_POOL_TEST_POINT(kClaimRead, tid, generation, piece);
      // note: the count must be this generation's (see job_pieces_): a
      // later job's means this one is finished, every piece claimed.
      const uint64_t tagged = job_pieces_.load(std::memory_order_acquire);
      if (static_cast<uint32_t>(tagged >> 32) != generation) return;
      pieces = static_cast<int64_t>(tagged & 0xFFFFFFFFu);
      if (piece >= pieces) return;
      // note: success means claim_ still held (generation, piece), so the
      // job fields read here and below belong to that job.
      if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        break;
      }
    }
    const int64_t n = job_n_.load(std::memory_order_relaxed);
    try {
      (*job_.load(std::memory_order_relaxed))(n * piece / pieces, n * (piece + 1) / pieces, tid);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker_loop(int tid) {
  uint64_t seen = 0;
  for (;;) {
    bool ready = false;
    for (int i = 0; i < kSpinIterations; ++i) {
      if (generation_.load(std::memory_order_acquire) != seen ||
          stop_.load(std::memory_order_acquire)) {
        ready = true;
        break;
      }
      cpu_relax();
    }
    if (!ready) {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] {
        return stop_.load() || generation_.load(std::memory_order_acquire) != seen;
      });
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    run_pieces(static_cast<uint32_t>(seen), tid);
    QTK_POOL_TEST_POINT(kLeft, tid, static_cast<uint32_t>(seen), -1);
  }
}

void ThreadPool::parallel_for_tid(int64_t n, RangeTidFn fn) {
  if (n <= 0) return;
  if (threads_ == 1) {
    fn(0, n, 0);
    return;
  }
  const int64_t pieces = std::min<int64_t>(n, kPiecesPerThread * threads_);
  // Only this thread writes the job fields and generation_; no piece of the
  // previous job can still be claimed (all were done before it returned).
  const uint64_t generation = generation_.load(std::memory_order_relaxed) + 1;
  job_.store(&fn, std::memory_order_relaxed);
  job_n_.store(n, std::memory_order_relaxed);
  job_pieces_.store(((generation & 0xFFFFFFFFu) << 32) | static_cast<uint64_t>(pieces),
                    std::memory_order_release);
  done_.store(0, std::memory_order_relaxed);
  QTK_POOL_TEST_POINT(kPublished, 0, static_cast<uint32_t>(generation), pieces);
  claim_.store((generation & 0xFFFFFFFFu) << 32, std::memory_order_release);
  {
    // The lock orders the bump with a worker that is about to sleep.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.store(generation, std::memory_order_release);
  }
  start_cv_.notify_all();
  run_pieces(static_cast<uint32_t>(generation), 0);
  // Only pieces already claimed by another worker can be outstanding here.
  for (int i = 0; done_.load(std::memory_order_acquire) < pieces; ++i) {
    if (i < kSpinIterations) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::parallel_for(int64_t n, RangeFn fn) {
  auto with_tid = [fn](int64_t b, int64_t e, int) { fn(b, e); };
  parallel_for_tid(n, with_tid);
}

}  // namespace qtk
