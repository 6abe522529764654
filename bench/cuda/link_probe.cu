// link_probe: what one link of a decode step's chain costs on this GPU, that
// is, the time from the last write of one phase to the first dependent read
// of the next, when every block of the next phase needs what every block of
// the one before wrote (a projection needs the whole row the kernel before
// produced). Three ways to run a chain of phases that each do almost
// nothing but that dependency:
//
//  - plain: one kernel per phase, in a CUDA graph, stream order;
//  - pdl:   the same with programmatic dependent launch, as the runtime runs
//           a decode step (kernels/cuda/launch.cuh): griddepcontrol.wait, then
//           launch_dependents, then the phase; "pdl 96K" with 96 KB of shared
//           memory a block, as the skinny products hold (two kernels' blocks
//           then do not all fit on the SMs at once);
//  - barrier: one persistent kernel whose phases are separated by a grid
//           barrier (an arrival counter in global memory; every block
//           resident at once, cooperative launch).
//
// Phase p: block b reads the value block (7 b + 1) mod G wrote in phase p - 1,
// adds 1 and writes its own. After L phases every value is L exactly when
// every read saw the phase before (checked: a link that let a read through
// early would leave a smaller value).
//
// Usage: qtk_link_probe [links per chain, default 2000]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/cuda/probe_check.h"

namespace {

constexpr int kThreads = 128;

// One phase of one block: read the neighbour's value of the previous phase.
__device__ __forceinline__ void phase(const unsigned* __restrict__ in, unsigned* __restrict__ out) {
  if (threadIdx.x == 0) {
    const unsigned g = gridDim.x, b = blockIdx.x;
    out[b] = __ldcg(in + (7 * b + 1) % g) + 1;
  }
}

// kPdl: the runtime's pdl_begin (wait for the previous kernel, then allow
// the next one to launch) before the phase.
template <bool kPdl>
__global__ void __launch_bounds__(kThreads) phase_kernel(const unsigned* in, unsigned* out) {
  if constexpr (kPdl) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  }
  phase(in, out);
}

// The grid barrier: block arrivals counted in *count (which only grows; the
// host zeroes it before each launch); barrier k returns once k x gridDim.x
// arrivals are in. The release/acquire pair makes each block's writes
// before the barrier visible to every block after it.
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(count) : "memory");
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(count) : "memory");
    } while (seen < target);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    persistent_kernel(unsigned* a, unsigned* b, int links, unsigned* count) {
  for (int p = 0; p < links; ++p) {
    phase(p % 2 == 0 ? a : b, p % 2 == 0 ? b : a);
    grid_barrier(count, static_cast<unsigned>(p + 1) * gridDim.x);
  }
}

// The values after a chain, all equal to `links` when every link held.
bool check(const unsigned* d, int g, int links, const char* what) {
  std::vector<unsigned> h(static_cast<size_t>(g));
  QTK_PROBE_CHECK(cudaMemcpy(h.data(), d, h.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
  for (int i = 0; i < g; ++i)
    if (h[static_cast<size_t>(i)] != static_cast<unsigned>(links)) {
      std::printf("%s: block %d holds %u after %d links (a dependency was not honoured)\n", what, i,
                  h[static_cast<size_t>(i)], links);
      return false;
    }
  return true;
}

// The best of 5 runs of `launch`, in milliseconds, each after `prepare`
// (outside the timed span).
template <class Prepare, class Launch>
float best_of_5(cudaStream_t s, Prepare&& prepare, Launch&& launch) {
  cudaEvent_t e0, e1;
  QTK_PROBE_CHECK(cudaEventCreate(&e0));
  QTK_PROBE_CHECK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int r = 0; r < 5; ++r) {
    prepare();
    QTK_PROBE_CHECK(cudaEventRecord(e0, s));
    launch();
    QTK_PROBE_CHECK(cudaEventRecord(e1, s));
    QTK_PROBE_CHECK(cudaStreamSynchronize(s));
    float ms = 0.0f;
    QTK_PROBE_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms);
  }
  QTK_PROBE_CHECK(cudaEventDestroy(e0));
  QTK_PROBE_CHECK(cudaEventDestroy(e1));
  return best;
}

// Microseconds per link of a chain of `links` kernels captured in a graph
// (best of 5 replays); the last phase writes into *last.
double kernel_chain(bool pdl, int g, int links, unsigned* a, unsigned* b, unsigned** last,
                    cudaStream_t s, size_t smem = 0) {
  cudaGraph_t graph;
  QTK_PROBE_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int p = 0; p < links; ++p) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(g));
    cfg.blockDim = dim3(kThreads);
    cfg.stream = s;
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    unsigned* in = p % 2 == 0 ? a : b;
    unsigned* out = p % 2 == 0 ? b : a;
    if (pdl)
      QTK_PROBE_CHECK(
          cudaLaunchKernelEx(&cfg, phase_kernel<true>, static_cast<const unsigned*>(in), out));
    else
      QTK_PROBE_CHECK(
          cudaLaunchKernelEx(&cfg, phase_kernel<false>, static_cast<const unsigned*>(in), out));
    *last = out;
  }
  QTK_PROBE_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  QTK_PROBE_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const float best = best_of_5(
      s,
      [&] {
        QTK_PROBE_CHECK(cudaMemsetAsync(a, 0, static_cast<size_t>(g) * sizeof(unsigned), s));
        QTK_PROBE_CHECK(cudaMemsetAsync(b, 0, static_cast<size_t>(g) * sizeof(unsigned), s));
      },
      [&] { QTK_PROBE_CHECK(cudaGraphLaunch(exec, s)); });
  QTK_PROBE_CHECK(cudaGraphExecDestroy(exec));
  QTK_PROBE_CHECK(cudaGraphDestroy(graph));
  return 1000.0 * best / links;
}

// Microseconds per link of one persistent kernel of `links` phases (best of 5).
double persistent_chain(int g, int links, unsigned* a, unsigned* b, unsigned* count,
                        unsigned** last, cudaStream_t s) {
  void* args[] = {&a, &b, &links, &count};
  const float best = best_of_5(
      s,
      [&] {
        QTK_PROBE_CHECK(cudaMemsetAsync(a, 0, static_cast<size_t>(g) * sizeof(unsigned), s));
        QTK_PROBE_CHECK(cudaMemsetAsync(b, 0, static_cast<size_t>(g) * sizeof(unsigned), s));
        QTK_PROBE_CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned), s));
      },
      [&] {
        QTK_PROBE_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(persistent_kernel),
                                                    dim3(static_cast<unsigned>(g)), dim3(kThreads),
                                                    args, 0, s));
      });
  *last = links % 2 == 0 ? a : b;
  return 1000.0 * best / links;
}

}  // namespace

int main(int argc, char** argv) {
  const int links = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (links < 2) {
    std::fprintf(stderr, "qtk_link_probe: expected a chain of at least 2 links, found %d\n", links);
    return 1;
  }
  cudaDeviceProp prop;
  QTK_PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
  int per_sm = 0;
  QTK_PROBE_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, kThreads, 0));
  std::printf("%s, %d SMs; %d links per chain; microseconds per link (best of 5)\n", prop.name,
              prop.multiProcessorCount, links);
  cudaStream_t s;
  QTK_PROBE_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned *a, *b, *count;
  const int max_g = 2 * prop.multiProcessorCount;
  QTK_PROBE_CHECK(cudaMalloc(&a, max_g * sizeof(unsigned)));
  QTK_PROBE_CHECK(cudaMalloc(&b, max_g * sizeof(unsigned)));
  QTK_PROBE_CHECK(cudaMalloc(&count, sizeof(unsigned)));
  bool ok = true;
  constexpr size_t kBig = 96 * 1024;
  QTK_PROBE_CHECK(cudaFuncSetAttribute(
      phase_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBig)));
  std::printf("%-8s %8s %8s %8s %8s\n", "blocks", "plain", "pdl", "pdl 96K", "barrier");
  for (const int g : {prop.multiProcessorCount / 4, prop.multiProcessorCount, max_g}) {
    unsigned* last = nullptr;
    const double plain = kernel_chain(false, g, links, a, b, &last, s);
    ok &= check(last, g, links, "plain");
    const double pdl = kernel_chain(true, g, links, a, b, &last, s);
    ok &= check(last, g, links, "pdl");
    const double pdl_big = kernel_chain(true, g, links, a, b, &last, s, kBig);
    ok &= check(last, g, links, "pdl 96K");
    double bar = -1.0;
    if (g <= per_sm * prop.multiProcessorCount) {
      bar = persistent_chain(g, links, a, b, count, &last, s);
      ok &= check(last, g, links, "barrier");
    }
    std::printf("%-8d %8.3f %8.3f %8.3f %8.3f\n", g, plain, pdl, pdl_big, bar);
  }
  QTK_PROBE_CHECK(cudaFree(a));
  QTK_PROBE_CHECK(cudaFree(b));
  QTK_PROBE_CHECK(cudaFree(count));
  return ok ? 0 : 1;
}
