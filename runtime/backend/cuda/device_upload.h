// Weight upload and buffer helpers of the CUDA backend.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "pack/pack.h"
#include "runtime/backend/cuda/device_memory.h"

namespace qtk::cuda {

template <class T>
constexpr DType dtype_of() {
  return std::is_same_v<T, float> ? DType::F32 : DType::BF16;
}

inline float half_to_float(uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

// note: host memory. Weights go up in chunks of kUploadChunkBytes, and each
// chunk's pack pages are handed back to the kernel (Pack::release_range,
// MADV_DONTNEED) right after its copy: a page of the pack's mapping counts
// in the process's RSS once read, so without that a run would keep a host
// copy of every weight (the pack's size) besides the device copy. The bytes
// stay readable at the same addresses (they fault back in from the page
// cache). A conversion (to f32, or from f16/f32 to bf16) goes through one
// chunk-sized host buffer, not a whole-tensor one.
inline constexpr size_t kUploadChunkBytes = size_t{64} << 20;

// note: the copy goes through two pinned chunk buffers of the calling
// thread: a chunk is copied into one (a memcpy from the mapping) while the
// other's DMA runs. Loads through cudaMemcpy straight from the pageable
// mapping (the driver stages pageable memory itself, one piece at a time)
// ran at 2.5-3 GB/s on the device hosts: 33 GB in ~11 s, 124 GB split over
// 2 GPUs in ~48 s. Each thread has its own buffers (a tensor-parallel rank
// uploads on its own thread and device); release_upload_staging() frees them
// once the model is up.
struct UploadStaging {
  void* buf[2] = {nullptr, nullptr};  // pinned, kUploadChunkBytes each
  cudaEvent_t copied[2] = {nullptr, nullptr};
  cudaStream_t stream = nullptr;
  int device = -1;

  UploadStaging() = default;
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;
  ~UploadStaging() { release(); }

  // The buffers, stream and events for the current device.
  void ensure() {
    int dev = 0;
    QTK_CUDA_CHECK(cudaGetDevice(&dev));
    if (stream != nullptr && dev == device) return;
    release();
    device = dev;
    QTK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int k = 0; k < 2; ++k) {
      QTK_CUDA_CHECK(cudaHostAlloc(&buf[k], kUploadChunkBytes, cudaHostAllocPortable));
      QTK_CUDA_CHECK(cudaEventCreateWithFlags(&copied[k], cudaEventDisableTiming));
    }
  }
  // note: errors are ignored here: it also runs at thread exit, possibly
  // after the CUDA runtime has shut down.
  void release() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (int k = 0; k < 2; ++k) {
      if (buf[k] != nullptr) cudaFreeHost(buf[k]);
      if (copied[k] != nullptr) cudaEventDestroy(copied[k]);
      buf[k] = nullptr;
      copied[k] = nullptr;
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
    stream = nullptr;
    device = -1;
  }
};

inline UploadStaging& upload_staging() {
  thread_local UploadStaging staging;
  return staging;
}

// Frees the calling thread's upload buffers (the next upload makes new ones).
inline void release_upload_staging() { upload_staging().release(); }

// Copies `bytes` bytes of a pack tensor at `src` to `dst` (device); returns
// once they are there.
inline void upload_pack_bytes(const Pack& pack, void* dst, const void* src, size_t bytes) {
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  // note: a small tensor (norms, biases) goes in one plain copy.
  if (bytes < (size_t{1} << 20)) {
    QTK_CUDA_CHECK(cudaMemcpy(d, s, bytes, cudaMemcpyHostToDevice));
    pack.release_range(s, bytes);
    return;
  }
  UploadStaging& st = upload_staging();
  st.ensure();
  int k = 0;
  for (size_t off = 0; off < bytes; off += kUploadChunkBytes, k ^= 1) {
    const size_t len = std::min(kUploadChunkBytes, bytes - off);
    // note: the chunk's pages are mapped in one call first (they are usually
    // in the page cache but not in this process: verify() handed them back).
    pack.prefault_range(s + off, len);
    QTK_CUDA_CHECK(cudaEventSynchronize(st.copied[k]));  // the buffer's last DMA is done
    std::memcpy(st.buf[k], s + off, len);
    pack.release_range(s + off, len);
    QTK_CUDA_CHECK(cudaMemcpyAsync(d + off, st.buf[k], len, cudaMemcpyHostToDevice, st.stream));
    QTK_CUDA_CHECK(cudaEventRecord(st.copied[k], st.stream));
  }
  QTK_CUDA_CHECK(cudaStreamSynchronize(st.stream));
  pack.release_range(s, bytes);  // the pages across chunk edges
}

// Copies a pack tensor (any shape; `name` for messages) to the device as T
// (bf16 -> bf16 is a plain copy).
template <class T>
DeviceMemory upload_view(const Pack& pack, const std::string& name, const TensorView& v) {
  const int64_t n = v.numel();
  DeviceMemory d(n * sizeof(T));
  if (v.dtype == dtype_of<T>()) {
    upload_pack_bytes(pack, d.as(), v.data, n * sizeof(T));
    return d;
  }
  if (v.dtype != DType::F32 && v.dtype != DType::BF16 && v.dtype != DType::F16)
    fail("{}: tensor '{}' has dtype {}; expected BF16, F16 or F32", pack.path(), name,
         dtype_name(v.dtype));
  const int64_t chunk = static_cast<int64_t>(kUploadChunkBytes / sizeof(T));
  std::vector<T> host(std::min(n, chunk));
  const auto* src = static_cast<const uint8_t*>(v.data);
  const int64_t src_es = static_cast<int64_t>(dtype_size(v.dtype));
  for (int64_t i0 = 0; i0 < n; i0 += chunk) {
    const int64_t len = std::min(chunk, n - i0);
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = i0 + j;
      float f;
      if (v.dtype == DType::F32) {
        std::memcpy(&f, src + 4 * i, 4);
      } else if (v.dtype == DType::BF16) {
        uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        const uint32_t u = static_cast<uint32_t>(b) << 16;
        std::memcpy(&f, &u, 4);
      } else {
        uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        f = half_to_float(b);
      }
      if constexpr (std::is_same_v<T, float>)
        host[j] = f;
      else
        host[j] = __float2bfloat16_rn(f);
    }
    QTK_CUDA_CHECK(
        cudaMemcpy(d.as<T>() + i0, host.data(), len * sizeof(T), cudaMemcpyHostToDevice));
    pack.release_range(src + i0 * src_es, len * src_es);
  }
  pack.release_range(src, n * src_es);
  return d;
}

// Copies a pack matrix [rows, cols] to the device as T.
template <class T>
DeviceMemory upload_matrix(const Pack& pack, const std::string& name, int64_t rows, int64_t cols) {
  const TensorView& v = pack.tensor(name);
  if (v.ndim != 2 || v.shape[0] != rows || v.shape[1] != cols)
    fail("{}: tensor '{}' has shape {}; expected [{}, {}] from the config", pack.path(), name,
         v.shape_string(), rows, cols);
  return upload_view<T>(pack, name, v);
}

inline DeviceMemory upload_vector(const Pack& pack, const std::string& name, int64_t n) {
  const TensorView& v = pack.tensor(name);
  if (v.dtype != DType::F32 || v.ndim != 1 || v.shape[0] != n)
    fail("{}: tensor '{}' is {} {}; expected F32 [{}]", pack.path(), name, dtype_name(v.dtype),
         v.shape_string(), n);
  DeviceMemory d(n * sizeof(float));
  upload_pack_bytes(pack, d.as(), v.data, n * sizeof(float));
  return d;
}

// Grows a device buffer to at least `bytes` (only when a step is larger than
// every earlier one).
// Returns true when it reallocated (graphs captured with the old buffer must go).
inline bool ensure(DeviceMemory& m, size_t bytes) {
  if (m.bytes() >= bytes) return false;
  m = DeviceMemory(bytes);
  return true;
}

// The attention split workspace (cuda::AttentionBatch::partials) for decode
// steps of up to `seqs` sequences (the padded bucket) x `heads` query heads;
// `rows` keeps the capacity. True when it was reallocated.
inline bool ensure_attention_partials(DeviceMemory& partials, int64_t& rows, int64_t seqs,
                                      int64_t heads, int64_t head_dim) {
  rows = std::max(rows, seqs * heads);
  return ensure(partials, attention_partials_floats(rows, head_dim) * sizeof(float));
}

// The RoPE (cos, sin) table for positions 0..max_context-1 (rope.table), grown
// with the context; true when it was (re)built (captured graphs hold the old
// pointer). Positions past it are computed inline with the same values.
inline bool ensure_rope_table(DeviceMemory& table, RopeParams& rope, int64_t max_context,
                              cudaStream_t stream) {
  if (max_context <= rope.table_positions) return false;
  const size_t bytes = static_cast<size_t>(max_context * (rope.rotary_dim / 2)) * sizeof(float2);
  ensure(table, bytes);
  rope_table_build(table.as<float2>(), max_context, rope, stream);
  rope.table = table.as<float2>();
  rope.table_positions = max_context;
  return true;
}

}  // namespace qtk::cuda
