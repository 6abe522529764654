// Tensor parallelism's collective: sum_ranks against its host reference bit
// for bit (one GPU), and DeviceCollective::all_reduce_sum over every GPU of
// the machine (2 or more) through NCCL, eagerly and replayed from a CUDA
// graph: every rank gets the bits of the reference order.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/rank_sum.h"
#include "runtime/backend/cuda/nccl.h"
#include "tests/cuda/gpu_test_util.h"

namespace qtk::cuda::test {
namespace {

// Partials of mixed magnitudes (|x| from 2^-8 to 2^8), so that adding them in
// another order rounds differently for many elements.
template <class T>
std::vector<T> partials(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<T> v(count);
  for (auto& x : v) x = from_float<T>(std::ldexp(mantissa(rng), exponent(rng)));
  return v;
}

// The index of the first element whose bits differ, or -1.
template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (!bitwise_equal(&a[i], &b[i], 1)) return static_cast<int64_t>(i);
  return -1;
}

template <class T>
class RankSumTest : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(RankSumTest, ActTypes);

TYPED_TEST(RankSumTest, MatchesReferenceBitForBit) {
  using T = TypeParam;
  // Awkward sizes take the one-element form; multiples of 8 the 16-byte
  // form; the last two loop over the grid (more elements than threads).
  // offset 1 moves both buffers off 16-byte alignment (one-element form).
  for (int ranks = 1; ranks <= 4; ++ranks)
    for (const int64_t n : {1, 7, 8, 1023, 1024, 4099, 65536, 65537, 4194312, 4194313})
      for (const int64_t offset : {0, 1}) {
        const auto g = partials<T>(ranks * n, static_cast<uint32_t>(ranks * 1000 + n));
        std::vector<T> ref(n);
        sum_ranks_ref(g.data(), n, ranks, ref.data());
        DeviceBuffer<T> gd(offset + ranks * n), out(offset + n);
        QTK_CUDA_CHECK(
            cudaMemcpy(gd.get() + offset, g.data(), g.size() * sizeof(T), cudaMemcpyHostToDevice));
        sum_ranks(gd.get() + offset, n, ranks, out.get() + offset, nullptr);
        QTK_CUDA_CHECK_LAUNCH();
        const auto all = out.download();
        const std::vector<T> got(all.begin() + offset, all.end());
        const int64_t i = first_difference(got, ref);
        EXPECT_EQ(i, -1) << "ranks " << ranks << " n " << n << " offset " << offset
                         << ": first differing element " << i << " got "
                         << (i >= 0 ? to_float(got[i]) : 0.0f) << " want "
                         << (i >= 0 ? to_float(ref[i]) : 0.0f);
      }
}

// The data above is such that the order is visible: summing the ranks in
// reverse gives other bits (so the test above would catch a wrong order).
TEST(RankSumOrder, DataMakesTheOrderVisible) {
  const int ranks = 4;
  const int64_t n = 65537;
  auto g = partials<float>(ranks * n, 4000 + n);
  std::vector<float> forward(n), reverse(n);
  sum_ranks_ref(g.data(), n, ranks, forward.data());
  std::vector<float> flipped(g.size());
  for (int r = 0; r < ranks; ++r)
    std::copy(g.begin() + r * n, g.begin() + (r + 1) * n, flipped.begin() + (ranks - 1 - r) * n);
  sum_ranks_ref(flipped.data(), n, ranks, reverse.data());
  EXPECT_NE(first_difference(forward, reverse), -1);
}

// ---- two GPUs through NCCL --------------------------------------------------

constexpr int64_t kMaxN = 1 << 20;
const int64_t kSizes[] = {1, 7, 1023, 4096, 4099, 65537, kMaxN};

// Waits for s. A rank whose peer never joined the collective would wait
// forever; after two minutes the run ends with a message instead of hanging.
void wait_stream(cudaStream_t s, int rank) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) QTK_CUDA_CHECK(e);
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "Failure: rank %d: the collective did not finish in 120 s; aborting\n",
                   rank);
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// A rank's stream (non-blocking: no implicit order with the legacy stream).
class Stream {
 public:
  Stream() { QTK_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Device memory of the current device, not initialised (every byte is
// written on the rank's stream before it is read).
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(int64_t n) {
    QTK_CUDA_CHECK(cudaMalloc(&p_, std::max<int64_t>(n, 1) * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

class GraphExec {
 public:
  ~GraphExec() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

// Runs body(rank) on one thread per rank, with the rank's device current;
// rethrows the first exception once every thread has ended.
template <class Body>
void on_ranks(NcclGroup& group, Body body) {
  std::vector<std::exception_ptr> errors(group.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        QTK_CUDA_CHECK(cudaSetDevice(group.device(r)));
        body(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// One NcclGroup over every visible device (up to 8) for the suite (creating
// communicators takes a while). Skipped with fewer than two GPUs; fails when
// NCCL cannot be loaded.
class NcclRanks : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) {
      skip_ = "nccl: needs 2 CUDA devices, found " + std::to_string(count);
      return;
    }
    try {
      std::vector<int> devices;
      for (int d = 0; d < std::min(count, 8); ++d) devices.push_back(d);
      group_ = new NcclGroup(devices);
      const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
      std::printf("[ nccl ] %s, version %s, NCCL_NVLS_ENABLE=%s, %zu ranks on devices 0..%zu\n",
                  nccl_library_path().c_str(), nccl_version().c_str(), nvls ? nvls : "(unset)",
                  devices.size(), devices.size() - 1);
      on_ranks(*group_, [](int r) { group_->rank(r).reserve(kMaxN * sizeof(float)); });
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    delete group_;
    group_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    if (!error_.empty()) FAIL() << error_;
  }

  static inline NcclGroup* group_ = nullptr;
  static inline std::string skip_, error_;
};

// Each rank's partial and the reference sum of all of them.
template <class T>
struct Case {
  std::vector<std::vector<T>> in;
  std::vector<T> want;
};

template <class T>
Case<T> make_case(int ranks, int64_t n) {
  Case<T> c;
  std::vector<T> gathered;
  for (int r = 0; r < ranks; ++r) {
    c.in.push_back(partials<T>(n, static_cast<uint32_t>(7919 * r + n)));
    gathered.insert(gathered.end(), c.in.back().begin(), c.in.back().end());
  }
  c.want.resize(n);
  sum_ranks_ref(gathered.data(), n, ranks, c.want.data());
  return c;
}

template <class T>
void check_eager(NcclGroup& group) {
  const int ranks = group.size();
  for (const int64_t n : kSizes) {
    const Case<T> c = make_case<T>(ranks, n);
    std::vector<std::vector<T>> got(ranks, std::vector<T>(n));
    on_ranks(group, [&](int r) {
      Stream s;
      DeviceArray<T> d(n);
      const size_t bytes = n * sizeof(T);
      QTK_CUDA_CHECK(cudaMemcpyAsync(d.get(), c.in[r].data(), bytes, cudaMemcpyHostToDevice, s));
      group.rank(r).all_reduce_sum(d.get(), n, s);
      wait_stream(s, r);
      QTK_CUDA_CHECK(cudaMemcpy(got[r].data(), d.get(), bytes, cudaMemcpyDeviceToHost));
    });
    for (int r = 0; r < ranks; ++r) {
      const int64_t i = first_difference(got[r], c.want);
      EXPECT_EQ(i, -1) << "rank " << r << " n " << n << ": first differing element " << i;
    }
  }
}

template <class T>
void check_graph(NcclGroup& group) {
  const int ranks = group.size();
  for (const int64_t n : {int64_t{4099}, kMaxN}) {
    const Case<T> c = make_case<T>(ranks, n);
    // got[r][k]: rank r's result of the eager call (k = 0) and the replays.
    std::vector<std::vector<std::vector<T>>> got(ranks,
                                                 std::vector<std::vector<T>>(3, std::vector<T>(n)));
    on_ranks(group, [&](int r) {
      Stream s;
      DeviceArray<T> d(n);
      const size_t bytes = n * sizeof(T);
      DeviceCollective& coll = group.rank(r);
      // note: one eager call first: NCCL may connect the ranks at their first
      // collective, which is not to happen inside a capture.
      QTK_CUDA_CHECK(cudaMemcpyAsync(d.get(), c.in[r].data(), bytes, cudaMemcpyHostToDevice, s));
      coll.all_reduce_sum(d.get(), n, s);
      wait_stream(s, r);
      QTK_CUDA_CHECK(cudaMemcpy(got[r][0].data(), d.get(), bytes, cudaMemcpyDeviceToHost));

      GraphExec g;
      QTK_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      try {
        coll.all_reduce_sum(d.get(), n, s);
      } catch (...) {
        cudaGraph_t dropped = nullptr;
        cudaStreamEndCapture(s, &dropped);
        if (dropped) cudaGraphDestroy(dropped);
        throw;
      }
      QTK_CUDA_CHECK(cudaStreamEndCapture(s, &g.graph));
      QTK_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
      for (int k = 1; k <= 2; ++k) {
        // The graph sums in place, so d gets the rank's partial again first.
        QTK_CUDA_CHECK(cudaMemcpyAsync(d.get(), c.in[r].data(), bytes, cudaMemcpyHostToDevice, s));
        QTK_CUDA_CHECK(cudaGraphLaunch(g.exec, s));
        wait_stream(s, r);
        QTK_CUDA_CHECK(cudaMemcpy(got[r][k].data(), d.get(), bytes, cudaMemcpyDeviceToHost));
      }
    });
    for (int r = 0; r < ranks; ++r)
      for (int k = 0; k < 3; ++k) {
        const int64_t i = first_difference(got[r][k], c.want);
        EXPECT_EQ(i, -1) << "rank " << r << " n " << n << (k == 0 ? " eager" : " replay ")
                         << (k == 0 ? "" : std::to_string(k)) << ": first differing element " << i;
      }
  }
}

TEST_F(NcclRanks, EagerSumsMatchReferenceOnEveryRank) {
  check_eager<float>(*group_);
  check_eager<bf16>(*group_);
}

TEST_F(NcclRanks, CapturedGraphReplaysGiveTheSameBits) {
  check_graph<float>(*group_);
  check_graph<bf16>(*group_);
}

// A size over the reservation is refused on every rank before any NCCL call
// (so no rank is left waiting for the others).
TEST_F(NcclRanks, RefusesMoreThanReserved) {
  std::vector<std::string> messages(group_->size());
  on_ranks(*group_, [&](int r) {
    Stream s;
    DeviceArray<float> d(kMaxN + 1);
    try {
      group_->rank(r).all_reduce_sum(d.get(), kMaxN + 1, s);
    } catch (const Error& e) {
      messages[r] = e.what();
    }
  });
  for (int r = 0; r < group_->size(); ++r)
    EXPECT_NE(messages[r].find("reserved"), std::string::npos)
        << "rank " << r << ": " << messages[r];
}

}  // namespace
}  // namespace qtk::cuda::test
