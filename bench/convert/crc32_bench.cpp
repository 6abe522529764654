// crc32_bench: GB/s of the CRC-32 implementations (pack/crc32.h) and of
// zlib's crc32, in 8 KiB calls (the buffer size libzip hands its CRC) over
// 64 MiB: 64 passes over 1 MiB of random bytes, so the data is in cache as
// in convert (libzip's 8 KiB buffer was just filled); the best of 5 runs.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "pack/crc32.h"

int main(int argc, char** argv) {
  if (argc > 1) {
    const bool help = std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h";
    std::fprintf(help ? stdout : stderr,
                 "usage: crc32_bench (no arguments): GB/s of the CRC-32 implementations and "
                 "zlib's crc32 in 8 KiB calls\n");
    return help ? 0 : 1;
  }
  using Clock = std::chrono::steady_clock;
  const size_t n = size_t{64} << 20, chunk = 8192, resident = size_t{1} << 20;
  std::vector<uint8_t> buf(resident);
  std::mt19937_64 g(1);
  for (auto& b : buf) b = static_cast<uint8_t>(g());
  auto time = [&](const char* name, auto&& fn) {
    double best = 1e30;
    uint32_t c = 0;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
      for (size_t i = 0; i < n; i += chunk) c = fn(c, buf.data() + i % resident, chunk);
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::printf("%-12s %6.2f GB/s  (crc %08x)\n", name, n / best / 1e9, c);
  };
  using ZlibCrc = unsigned long (*)(unsigned long, const unsigned char*, unsigned int);
  void* z = ::dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
  auto zlib = z ? reinterpret_cast<ZlibCrc>(::dlsym(z, "crc32")) : nullptr;
  if (zlib)
    time("zlib", [&](uint32_t c, const uint8_t* p, size_t len) {
      return static_cast<uint32_t>(zlib(c, p, static_cast<unsigned>(len)));
    });
  for (auto impl : {qtk::Crc32Impl::kTable, qtk::Crc32Impl::kPclmul, qtk::Crc32Impl::kVpclmul})
    if (qtk::crc32_available(impl))
      time(qtk::crc32_name(impl), [&](uint32_t c, const uint8_t* p, size_t len) {
        return qtk::crc32_update_with(impl, c, p, len);
      });
  std::printf("selected: %s\n", qtk::crc32_name(qtk::crc32_selected()));
  return 0;
}
