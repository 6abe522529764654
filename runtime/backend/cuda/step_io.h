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
  GreedyReadback() = default;
  GreedyReadback(const GreedyReadback&) = delete;
  GreedyReadback& operator=(const GreedyReadback&) = delete;
  ~GreedyReadback() {
    for (auto& q : queued_)
      if (q.event != nullptr) cudaEventDestroy(q.event);
  }

  // Room for `rows` rows (the padded bucket of a graph step); true when the
  // device buffer moved (graphs that captured it must go). The last step's
  // ids move with it (on `stream`): a pipelined next step may feed on them.
  bool reserve(int64_t rows, cudaStream_t stream) {
    const int64_t old_cap = cap_;
    cap_ = std::max(cap_, rows);
    const size_t bytes = static_cast<size_t>(work_offset() + argmax_work_bytes(cap_));
    if (dev_.bytes() >= bytes) return false;
    DeviceMemory grown(bytes);
    if (dev_.bytes() > 0)
      QTK_CUDA_CHECK(cudaMemcpyAsync(grown.as(), dev_.as(), old_cap * sizeof(int32_t),
                                     cudaMemcpyDeviceToDevice, stream));
    QTK_CUDA_CHECK(cudaStreamSynchronize(stream));  // before the old buffer is freed
    dev_ = std::move(grown);
    return true;
  }
  // The ids of the last argmax (device; StepBatch::feed reads them).
  const int32_t* ids() const { return dev_.as<int32_t>(); }
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
  // (Only with no pipelined read queued in slot 0.)
  void read(int64_t rows, int64_t n, int32_t* ids, float* margins, cudaStream_t stream) {
    queue(rows, 0, stream);
    finish(0, n, ids, margins);
  }
  // The pipelined form of read(): queue() copies the step's `rows` rows into
  // page-locked slot 0 or 1 and marks the stream there; finish() waits for
  // that mark and gives the first n rows.
  void queue(int64_t rows, int slot, cudaStream_t stream) {
    Queued& q = queued_[slot];
    q.host.resize(2 * rows);
    q.rows = rows;
    QTK_CUDA_CHECK(cudaMemcpyAsync(q.host.data(), dev_.as(), 2 * rows * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream));
    if (q.event == nullptr)
      QTK_CUDA_CHECK(cudaEventCreateWithFlags(&q.event, cudaEventDisableTiming));
    QTK_CUDA_CHECK(cudaEventRecord(q.event, stream));
  }
  void finish(int slot, int64_t n, int32_t* ids, float* margins) {
    Queued& q = queued_[slot];
    QTK_CUDA_CHECK(cudaEventSynchronize(q.event));
    std::memcpy(ids, q.host.data(), n * sizeof(int32_t));
    std::memcpy(margins, q.host.data() + q.rows, n * sizeof(float));
  }

 private:
  // Bytes before the workspace: ids and margins of cap_ rows, 16-byte aligned.
  int64_t work_offset() const {
    return (2 * cap_ * static_cast<int64_t>(sizeof(int32_t)) + 15) / 16 * 16;
  }

  DeviceMemory dev_;  // int32 ids [rows] then f32 margins [rows] of the last argmax, workspace
  struct Queued {
    PinnedVector<int32_t> host;  // ids [rows] then margins [rows]
    int64_t rows = 0;
    cudaEvent_t event = nullptr;
  };
  Queued queued_[2];
  int64_t cap_ = 0;
};

}  // namespace qtk::cuda
