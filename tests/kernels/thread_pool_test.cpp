#include "kernels/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace qtk {
namespace {

TEST(ThreadPool, CoversEveryIndexOnceWithContiguousPieces) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {1, 2, 3, 7, 64, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      std::vector<int64_t> piece_begin(threads, -1), piece_end(threads, -1);
      pool.parallel_for_tid(n, [&](int64_t b, int64_t e, int tid) {
        piece_begin[tid] = b;
        piece_end[tid] = e;
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
      // The split is the documented static one.
      for (int t = 0; t < threads; ++t) {
        int64_t b = n * t / threads, e = n * (t + 1) / threads;
        if (b < e) {
          EXPECT_EQ(piece_begin[t], b);
          EXPECT_EQ(piece_end[t], e);
        } else {
          EXPECT_EQ(piece_begin[t], -1);
        }
      }
    }
  }
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
