// The host ends of a step's transfers: the step arrays going up and the
// greedy ids and margins coming back, through page-locked host memory.
//
// note: the upload came from pageable memory (a staging copy), the argmax
// was launched after the graph, and ids and margins came back in two
// pageable device-to-host copies, each its own round trip. Page-locked
// buffers make each transfer one DMA, the argmax runs inside the captured
// graph, and ids and margins come back in one copy: with every layer and
// lm_head left out, a Qwen3-0.6B decode step costs 0.02 ms (H100).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/backend/cuda/device_memory.h"
#include "runtime/backend/cuda/device_upload.h"

namespace qtk::cuda {

// A grow-only array in page-locked host memory (cudaHostAlloc). resize()
// does not keep the contents when it grows: callers fill it after resizing.
// (Its size is the caller's: only the capacity is kept.)
template <class T>
class PinnedVector {
 public:
  PinnedVector() = default;
  ~PinnedVector() {
    if (p_) cudaFreeHost(p_);
  }
  PinnedVector(const PinnedVector&) = delete;
  PinnedVector& operator=(const PinnedVector&) = delete;

  void resize(int64_t n) {
    if (n > cap_) {
      if (p_) cudaFreeHost(std::exchange(p_, nullptr));
      QTK_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&p_), n * sizeof(T), 0));
      cap_ = n;
    }
  }
  T* data() { return p_; }

 private:
  T* p_ = nullptr;
  int64_t cap_ = 0;
};

// Greedy results of a step: argmax on the device (capturable, so a decode
// graph holds it), then one copy of ids and margins to the host.
class GreedyReadback {
 public:
  // Room for `rows` rows (the padded bucket of a graph step); true when the
  // device buffer moved (graphs that captured it must go).
  bool reserve(int64_t rows) {
    cap_ = std::max(cap_, rows);
    return ensure(dev_, static_cast<size_t>(work_offset() + argmax_work_bytes(cap_)));
  }
  // ids and margins of `rows` rows of logits (f32, row stride vocab).
  // Layout on the device: int32 ids [rows], then f32 margins [rows]; past
  // them, argmax_rows' workspace.
  void argmax(const float* logits, int64_t vocab, int64_t rows, cudaStream_t stream) {
    int32_t* ids = dev_.as<int32_t>();
    argmax_rows(logits, vocab, rows, vocab, ids, reinterpret_cast<float*>(ids + rows), stream,
                static_cast<char*>(dev_.as()) + work_offset());
  }
  // The first n of the `rows` rows of the step's argmax() (a replayed graph
  // ran it: rows is the graph's, not the last host call's) to the host, in
  // one transfer; waits for the stream.
  void read(int64_t rows, int64_t n, int32_t* ids, float* margins, cudaStream_t stream) {
    host_.resize(2 * rows);
    QTK_CUDA_CHECK(cudaMemcpyAsync(host_.data(), dev_.as(), 2 * rows * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream));
    QTK_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::memcpy(ids, host_.data(), n * sizeof(int32_t));
    std::memcpy(margins, host_.data() + rows, n * sizeof(float));
  }

 private:
  // Bytes before the workspace: ids and margins of cap_ rows, 16-byte aligned.
  int64_t work_offset() const {
    return (2 * cap_ * static_cast<int64_t>(sizeof(int32_t)) + 15) / 16 * 16;
  }

  DeviceMemory dev_;  // int32 ids [rows] then f32 margins [rows] of the last argmax, workspace
  PinnedVector<int32_t> host_;
  int64_t cap_ = 0;
};

}  // namespace qtk::cuda
