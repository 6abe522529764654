// The pool's claim protocol under one fixed interleaving (the one behind a
// rare invariance failure: paths.avx2.runtime_invariance once gave a margin
// 1 ulp off, other runs changed tokens or crashed), forced through the test
// points of kernels/thread_pool.h (this file is built with thread_pool.cpp
// and QTK_THREAD_POOL_TEST_HOOKS defined: tests/kernels/CMakeLists.txt).
//
// Job A has 2 pieces, one per thread. The worker finishes its piece, reads
// claim_ = (A, 2) (every piece of A claimed) and is held there. The caller
// returns from A and writes job B's fields (16 pieces), and is held before
// it opens claim_ for B. The worker then goes on: it must find no piece of
// A left. The bug: it compared piece 2 with B's piece count (16), won the
// compare-and-swap on (A, 2) and ran pieces of B that the caller then ran
// again, counting them in B's done count.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "kernels/thread_pool.h"

namespace qtk {
namespace {

// Waits until pred() or about 20 s; false on timeout.
template <class Pred>
bool wait_for(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

struct Script {
  std::atomic<int> stage{0};  // 1: job A, 2: job B
  std::atomic<uint32_t> gen_a{0};
  std::atomic<bool> have_a{false};
  std::atomic<bool> worker_held{false};
  std::atomic<bool> release_worker{false};
  std::atomic<bool> worker_left_a{false};
  std::atomic<bool> b_open{false};
  std::atomic<bool> timed_out{false};
};

Script* g_script = nullptr;

void hook(pool_test::Point point, int tid, uint32_t generation, int64_t piece) {
  Script& s = *g_script;
  switch (point) {
    case pool_test::Point::kPublished:
      if (s.stage.load() == 1 && !s.have_a.load()) {
        s.gen_a.store(generation);
        s.have_a.store(true);
      } else if (s.stage.load() == 2 && !s.b_open.load()) {
        // Job B's fields are written; claim_ still holds (A, 2). Let the
        // held worker go on, and open B only once it has left job A.
        s.release_worker.store(true);
        if (!wait_for([&] { return s.worker_left_a.load(); })) s.timed_out.store(true);
        s.b_open.store(true);
      }
      break;
    case pool_test::Point::kClaimRead:
      if (tid == 1 && s.have_a.load() && generation == s.gen_a.load() && piece == 2 &&
          !s.worker_held.exchange(true)) {
        if (!wait_for([&] { return s.release_worker.load(); })) s.timed_out.store(true);
      }
      break;
    case pool_test::Point::kLeft:
      if (tid == 1 && s.release_worker.load() && generation == s.gen_a.load())
        s.worker_left_a.store(true);
      break;
  }
}

TEST(ThreadPoolRace, AWorkerHoldingTheFinishedJobsLastClaimRunsNoPieceOfTheNextJob) {
  Script script;
  g_script = &script;
  pool_test::hook = hook;
  {
    ThreadPool pool(2);
    // Job A: 2 pieces, each waits for the other, so each thread runs one.
    script.stage.store(1);
    std::atomic<int> entered{0};
    std::atomic<int> a_tids{0};
    pool.parallel_for_tid(2, [&](int64_t, int64_t, int tid) {
      a_tids.fetch_or(1 << tid);
      entered.fetch_add(1);
      if (!wait_for([&] { return entered.load() == 2; })) script.timed_out.store(true);
    });
    EXPECT_EQ(a_tids.load(), 3) << "each thread runs one piece of job A";
    ASSERT_TRUE(wait_for([&] { return script.worker_held.load(); }))
        << "the worker never read claim_ = (A, 2)";

    // Job B: 16 pieces.
    script.stage.store(2);
    std::vector<std::atomic<int>> hits(16);
    std::atomic<int> before_open{0};
    std::atomic<int> in_flight{0};
    pool.parallel_for_tid(16, [&](int64_t b, int64_t e, int) {
      in_flight.fetch_add(1);
      if (!script.b_open.load()) before_open.fetch_add(1);
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      in_flight.fetch_sub(1);
    });
    const int running_at_return = in_flight.load();
    // Let anything still running finish before the checks (and before the
    // pool and these locals go away).
    EXPECT_TRUE(wait_for([&] { return in_flight.load() == 0; }));
    EXPECT_EQ(before_open.load(), 0) << "pieces of job B ran under job A's claim";
    EXPECT_EQ(running_at_return, 0) << "parallel_for returned while a piece was running";
    for (int i = 0; i < 16; ++i) EXPECT_EQ(hits[i].load(), 1) << "index " << i;
    EXPECT_FALSE(script.timed_out.load());
  }
  pool_test::hook = nullptr;
  g_script = nullptr;
}

}  // namespace
}  // namespace qtk
