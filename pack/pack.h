// Reader of a .pack file (see convert/ for the writer and docs/PACK_FORMAT
// in README.md). A pack is a zip whose entries are all STORED and 64-byte
// aligned, so tensors are used in place from one read-only mapping.
//
// Pack::open validates the whole zip structure (end-of-central-directory,
// zip64 records, the central directory, every local header, alignment,
// bounds, non-overlap) and the manifest before returning; checksums are only
// recomputed by verify().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "core/tensor_view.h"
#include "loaders/model_config.h"

namespace qtk {

// The pack format this build writes and reads.
inline constexpr int kPackFormatMajor = 1;
inline constexpr int kPackFormatMinor = 0;

struct PackTensorInfo {
  std::string name;       // canonical name, e.g. "layers.3.self_attn.qkv_proj"
  std::string entry;      // zip entry name
  TensorView view;        // points into the mapping
  uint64_t checksum = 0;  // as recorded in the manifest
};

// The block scales of an F8_E4M3 pack tensor (manifest "quantization"):
// real weight [r, c] = fp8 value x scale[r / block_rows, c / block_cols],
// rows being all dims but the last.
struct PackFp8Scales {
  std::string tensor;      // "layers.0.mlp.gate_up_proj"
  TensorView weight;       // the F8_E4M3 tensor itself
  std::string scale_name;  // "layers.0.mlp.gate_up_proj.scale"
  TensorView scale;        // f32 [ceil(rows/block_rows), ceil(cols/block_cols)]
  int64_t block_rows = 0;
  int64_t block_cols = 0;  // a multiple of 16 (the kernels' vector width)
};

class Pack {
 public:
  // Opens and validates `path`. Throws qtk::Error naming the file and the
  // problem (not a zip, compressed entry, misaligned entry, unknown major
  // version, manifest field missing, ...).
  static std::unique_ptr<Pack> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const nlohmann::json& manifest() const { return manifest_; }
  const ModelConfig& config() const { return config_; }

  // Canonical tensor lookup. tensor() throws qtk::Error naming the pack and
  // the tensor when it is missing; find_tensor() returns nullptr.
  const PackTensorInfo* find_tensor(std::string_view name) const;
  const TensorView& tensor(std::string_view name) const;
  const std::vector<PackTensorInfo>& tensors() const { return tensors_; }

  // The scales of F8_E4M3 tensor `name`, or nullptr when it has none (every
  // F8_E4M3 tensor of a pack that opened has them).
  const PackFp8Scales* fp8_scales(std::string_view name) const;
  const std::vector<PackFp8Scales>& fp8_tensors() const { return fp8_; }

  // Raw bytes of a non-tensor entry ("tokenizer.json", "generation_config.json", ...).
  std::optional<std::string_view> entry(std::string_view name) const;

  // True when the manifest lists a layout transform with this name
  // (for example "norm_plus_one_folded").
  bool has_transform(std::string_view name) const;

  // A digest identifying the pack's content (the manifest's tensor names,
  // dtypes, shapes and checksums, config, tokenizer files, ...: everything
  // but where it came from and the tool version), for run headers.
  const std::string& digest() const { return digest_; }

  // Recomputes every entry's checksum (tensors and the files the manifest
  // lists); throws qtk::Error naming the first entry that does not match.
  // Returns the number of entries checked. With release_pages each tensor's
  // pages go back to the kernel once hashed (release_range): for a caller
  // that reads the weights once more to copy them elsewhere (a CUDA upload),
  // so that hashing the whole pack does not keep all of it in the process's
  // RSS until then.
  size_t verify(bool release_pages = false) const;

  // Reads the whole mapping in and maps its pages now (best effort, errors
  // ignored), so that the first forward pass does not pay the disk reads
  // and page faults inside its timed region. Returns the bytes covered.
  // note: CPU models call it at construction; tools that read a few
  // entries (inspect, verify) do not.
  size_t prefault() const;

  // Replaces the pages behind the whole mapping with an anonymous copy on
  // transparent huge pages (2 MiB), at the same addresses, so every pointer
  // into the pack (tensor views, entries) stays valid and the bytes are
  // unchanged. Reads the file once (like prefault()). Falls back to
  // prefault() when the kernel refuses huge pages or the anonymous mapping;
  // throws qtk::Error only if the final move failed after the old pages were
  // already gone. Calling it again is a no-op. Returns the bytes copied (0 on
  // fallback).
  // note: why: a decode step streams every weight once; on 4 KiB page-cache
  // pages that is a TLB miss every 4 KiB and hardware prefetch streams that
  // stop at every page boundary. Cost: the copy becomes anonymous memory of
  // the process (the pack's size in RSS, as the mapped page cache was; the
  // page cache itself stays behind as reclaimable cache), ~0.2-0.5 s per GB
  // at load. The CPU models call it unless QTK_HUGEPAGES=0
  // (bench/RESULTS.md has the measurement).
  size_t copy_to_hugepages() const;

  // Reads the pages of [p, p + n) (a range inside the pack) in now, like
  // prefault() for part of the pack. Best effort.
  void prefault_range(const void* p, size_t n) const;

  // Gives the pages of [p, p + n) back to the kernel (whole pages inside the
  // range; MADV_DONTNEED): the bytes stay readable at the same addresses and
  // fault back in from the page cache (or the file) when read. A no-op after
  // copy_to_hugepages(), where dropping pages would lose them. For a model
  // that keeps its own copy of some tensors (runtime/backend/cpu/tiled_weights.h).
  void release_range(const void* p, size_t n) const;

  // What the CPU models call at construction: copy_to_hugepages(), or only
  // prefault() when the environment sets QTK_HUGEPAGES=0 or the copy does
  // not fit (anonymous_copy_fits).
  size_t load_for_cpu() const;

  // True when an anonymous copy of the whole pack (huge pages, tile-order
  // weights) takes at most 3/4 of the memory the kernel reports available
  // (MemAvailable; true when /proc/meminfo cannot be read).
  // note: why: the file mapping's pages are page cache the kernel can drop
  // and re-read under memory pressure; an anonymous copy cannot be dropped
  // (no swap here), so a pack near the machine's memory would be killed by
  // the OOM killer instead of running slower.
  bool anonymous_copy_fits() const;

 private:
  Pack() = default;
  // Reads and validates the zip structure into entries_: end records,
  // central directory, local headers; STORED, aligned, non-overlapping.
  void read_zip_entries(const std::string& path);
  // Reads and validates the manifest's "tensors" list into tensors_.
  void read_tensor_list(const std::string& mwhere);
  // Reads and validates the manifest's "quantization" section into fp8_.
  void read_fp8_section(const std::string& mwhere);
  // digest_: xxh64 over the manifest but its "source" and "tool_version".
  void compute_digest();
  MappedFile file_;
  nlohmann::json manifest_;
  ModelConfig config_;
  std::vector<PackTensorInfo> tensors_;
  std::vector<PackFp8Scales> fp8_;
  struct RawEntry {
    std::string name;
    uint64_t offset = 0;  // of the data in the file
    uint64_t size = 0;
    uint32_t crc = 0;  // the central directory's CRC-32 of the data
  };
  std::vector<RawEntry> entries_;
  std::string digest_;
  mutable bool on_hugepages_ = false;  // copy_to_hugepages() has run
};

}  // namespace qtk
