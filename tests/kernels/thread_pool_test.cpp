#include "kernels/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace qtk {
namespace {

TEST(ThreadPool, CoversEveryIndexOnceWithTheDocumentedPieces) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {1, 2, 3, 7, 64, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      std::mutex m;
      std::set<std::pair<int64_t, int64_t>> got;
      pool.parallel_for_tid(n, [&](int64_t b, int64_t e, int tid) {
        EXPECT_GE(tid, 0);
        EXPECT_LT(tid, threads);
        for (int64_t i = b; i < e; ++i) hits[i]++;
        std::lock_guard<std::mutex> lock(m);
        got.insert({b, e});
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
      // The pieces are the documented ones (one piece when single-threaded).
      std::set<std::pair<int64_t, int64_t>> want;
      const int64_t pieces =
          threads == 1 ? 1 : std::min<int64_t>(n, ThreadPool::kPiecesPerThread * threads);
      for (int64_t c = 0; c < pieces; ++c) want.insert({n * c / pieces, n * (c + 1) / pieces});
      EXPECT_EQ(got, want) << "threads=" << threads << " n=" << n;
    }
  }
}

TEST(ThreadPool, AStalledWorkerHoldsUpOnlyThePieceItClaimed) {
  // Worker 1 stalls in the first piece it runs (as if descheduled); the
  // caller must take every other piece instead of waiting for it. With a
  // fixed split worker 1 would own half of the range.
  ThreadPool pool(2);
  std::atomic<int64_t> by_worker{0};
  std::atomic<bool> stalled{false};
  pool.parallel_for_tid(64, [&](int64_t b, int64_t e, int tid) {
    if (tid == 1) {
      by_worker += e - b;
      if (!stalled.exchange(true)) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  EXPECT_LE(by_worker.load(), 64 / (ThreadPool::kPiecesPerThread * 2));
}

TEST(ThreadPool, ManySmallJobsInARow) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int rep = 0; rep < 2000; ++rep) {
    pool.parallel_for(4, [&](int64_t b, int64_t e) { total += e - b; });
  }
  EXPECT_EQ(total.load(), 8000);
}

TEST(ThreadPool, NullPoolRunsInline) {
  int calls = 0;
  parallel_for(nullptr, 10, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace qtk

namespace qtk {
namespace {

TEST(ThreadPool, PinnedPoolRunsEveryPiece) {
  // Pinning is best effort; what must hold is that work still completes and
  // the worker threads are not all squeezed onto the caller's CPU.
  ThreadPool pool(2, /*pin=*/true);
  std::vector<int> seen(100, 0);
  pool.parallel_for(100, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) seen[i] = 1;
  });
  for (int v : seen) EXPECT_EQ(v, 1);
}

}  // namespace
}  // namespace qtk
