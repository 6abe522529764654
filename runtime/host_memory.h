// The host memory a run may still take, as generate sizes its CPU KV cache by
// it (runtime/generate.cpp) and `--devices` shares it among CPU workers
// (runtime/data_parallel.cpp).
#pragma once

#include <cstdint>

namespace qtk {

// Bytes this process may still take, or -1 where it cannot be told:
// QTK_MEM_AVAILABLE where set (core/tuning.h), else /proc/meminfo's
// MemAvailable, lowered to what the cgroup's memory.max leaves (a
// container's limit, which MemAvailable does not show).
int64_t available_memory_bytes();

}  // namespace qtk
