// kernel_trace: a CUPTI injection library that records when every kernel of
// a process ran on the GPU (start and end in GPU nanoseconds, also for the
// nodes of CUDA graphs and for kernels overlapped by programmatic dependent
// launch), for the machines that have CUPTI but no Nsight Systems.
//
//   QTK_KERNEL_TRACE=trace.csv CUDA_INJECTION64_PATH=$BUILD/lib/libqtk_kernel_trace.so \
//     $BUILD/bin/cuda_model_bench --pack P --batches 1 --gen 64
//   python3 bench/cuda/step_trace.py trace.csv
//
// The CUDA driver loads the library when the process initialises CUDA and
// calls InitializeInjection; the records are written when the process exits.
// CSV columns: start_ns, end_ns, graph_id, graph_node_id, grid (x*y*z),
// block (x*y*z), dynamic shared memory bytes, the kernel's mangled name.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = size_t{16} << 20;

struct Row {
  uint64_t start, end;
  uint32_t graph_id;
  uint64_t graph_node_id;
  int64_t grid, block;
  int32_t smem;
  std::string name;
};

std::mutex g_mutex;
std::vector<Row>* g_rows = nullptr;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    g_rows->push_back(Row{k->start, k->end, k->graphId, k->graphNodeId,
                          int64_t{k->gridX} * k->gridY * k->gridZ,
                          int64_t{k->blockX} * k->blockY * k->blockZ, k->dynamicSharedMemory,
                          k->name != nullptr ? k->name : "?"});
  }
  std::free(buffer);
}

void write_trace() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("QTK_KERNEL_TRACE");
  if (path == nullptr || *path == '\0') path = "kernel_trace.csv";
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path);
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(f, "start_ns,end_ns,graph_id,graph_node_id,grid,block,smem,name\n");
  for (const Row& r : *g_rows)
    std::fprintf(f, "%llu,%llu,%u,%llu,%lld,%lld,%d,%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.graph_id,
                 static_cast<unsigned long long>(r.graph_node_id), static_cast<long long>(r.grid),
                 static_cast<long long>(r.block), r.smem, r.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "kernel_trace: %zu kernels -> %s\n", g_rows->size(), path);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  g_rows = new std::vector<Row>();
  g_rows->reserve(size_t{1} << 20);
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI activity tracing could not be enabled\n");
    return 0;
  }
  std::atexit(write_trace);
  return 1;
}
