// The process's resident memory now, from /proc/self/status (Linux), for
// the run header's account of where a CUDA run's host memory goes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace qtk {

struct ProcessMemory {
  int64_t rss_bytes = -1;   // VmRSS: resident now
  int64_t hwm_bytes = -1;   // VmHWM: the peak so far
  int64_t anon_bytes = -1;  // RssAnon: heap, driver allocations, pinned buffers
  int64_t file_bytes = -1;  // RssFile: mapped files (libraries, the pack's pages)
};

// -1 fields where /proc/self/status cannot be read.
inline ProcessMemory process_memory() {
  ProcessMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return m;
  char line[256];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long kb = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) m.rss_bytes = kb * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) m.hwm_bytes = kb * 1024;
    if (std::sscanf(line, "RssAnon: %lld kB", &kb) == 1) m.anon_bytes = kb * 1024;
    if (std::sscanf(line, "RssFile: %lld kB", &kb) == 1) m.file_bytes = kb * 1024;
  }
  std::fclose(f);
  return m;
}

}  // namespace qtk
