// membw: measures the machine's read bandwidth (GB/s) with 1..N threads, so
// end-to-end numbers can be reported as a fraction of it, measured in the
// same run on the same (noisy, shared) machine.
//
//   membw [--mb 1024] [--threads N] [--repeats 5]   → JSON on stdout
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

// note: sums 64-bit words with 8 independent accumulators so the loop is
// bound by loads, not by the add latency; the compiler vectorises it.
uint64_t sum_range(const uint64_t* p, size_t n) {
  uint64_t a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  for (; i < n; ++i) a[0] += p[i];
  uint64_t s = 0;
  for (uint64_t x : a) s += x;
  return s;
}

double measure(const uint64_t* buf, size_t words, int threads, int repeats) {
  double best = 0;
  volatile uint64_t sink = 0;
  for (int r = 0; r < repeats; ++r) {
    std::vector<std::thread> pool;
    std::vector<uint64_t> out(threads);
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t begin = words * t / threads, end = words * (t + 1) / threads;
        out[t] = sum_range(buf + begin, end - begin);
      });
    }
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (uint64_t x : out) sink = sink + x;
    best = std::max(best, words * 8.0 / s / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mb = 1024;
  int max_threads = static_cast<int>(std::thread::hardware_concurrency());
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mb") && i + 1 < argc)
      mb = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      max_threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc)
      repeats = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: membw [--mb N] [--threads N] [--repeats N]\n");
      return 1;
    }
  }
  const size_t words = mb * (1 << 20) / 8;
  std::vector<uint64_t> buf(words);
  for (size_t i = 0; i < words; ++i) buf[i] = i * 0x9e3779b97f4a7c15ULL;  // touch every page
  std::printf("{\"buffer_mb\": %zu, \"read_gbps\": {", mb);
  for (int t = 1; t <= max_threads; ++t)
    std::printf("%s\"%d\": %.2f", t > 1 ? ", " : "", t, measure(buf.data(), words, t, repeats));
  std::printf("}}\n");
  return 0;
}
