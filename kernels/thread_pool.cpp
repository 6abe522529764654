#include "kernels/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <exception>

namespace qtk {

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

void ThreadPool::run_piece(int tid) {
  int64_t begin = job_n_ * tid / threads_;
  int64_t end = job_n_ * (tid + 1) / threads_;
  if (begin < end) (*job_)(begin, end, tid);
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
    run_piece(tid);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for_tid(int64_t n,
                                  const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (threads_ == 1) {
    fn(0, n, 0);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  pending_.store(threads_ - 1, std::memory_order_relaxed);
  {
    // The lock orders the bump with a worker that is about to sleep.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  start_cv_.notify_all();
  // note: kernels do not throw inside parallel regions; if the caller's own
  // piece throws anyway, wait for the others before rethrowing so that no
  // worker still runs fn when the caller's frame is gone.
  std::exception_ptr error;
  try {
    run_piece(0);
  } catch (...) {
    error = std::current_exception();
  }
  for (int i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) {
    if (i < kSpinIterations) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_for_tid(n, [&fn](int64_t b, int64_t e, int) { fn(b, e); });
}

}  // namespace qtk
