#include "runtime/host_memory.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "core/tuning.h"

namespace qtk {
namespace {

// A whole number of bytes read from `path` (its first token), or -1.
int64_t bytes_in_file(const char* path) {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  long long v = -1;
  if (std::fscanf(f, "%lld", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}

}  // namespace

int64_t available_memory_bytes() {
  if (tuning().mem_available > 0) return tuning().mem_available;
  int64_t available = -1;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r"); f != nullptr) {
    int64_t kib = -1;
    char line[256];
    while (std::fgets(line, sizeof(line), f) != nullptr)
      if (std::sscanf(line, "MemAvailable: %" SCNd64 " kB", &kib) == 1) break;
    std::fclose(f);
    if (kib >= 0) available = kib * 1024;
  }
  // note: memory.max is "max" (no limit, read as -1 here) or a byte count.
  const int64_t limit = bytes_in_file("/sys/fs/cgroup/memory.max"),
                used = bytes_in_file("/sys/fs/cgroup/memory.current");
  if (limit > 0 && used >= 0) {
    const int64_t left = std::max<int64_t>(limit - used, 0);
    available = available < 0 ? left : std::min(available, left);
  }
  return available;
}

}  // namespace qtk
