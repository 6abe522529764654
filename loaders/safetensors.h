// A validated, memory-mapped .safetensors file with zero-copy tensor views.
//
// Layout: u64 little-endian header length N, N bytes of UTF-8 JSON, then the
// data buffer. SafetensorsFile::open checks everything before returning:
//   - the file holds at least the 8 length bytes; N <= 100 MB and 8 + N <= file size
//   - the header is valid UTF-8 and a JSON object without duplicate keys
//   - every tensor: non-empty name without control characters; exactly the
//     fields dtype (a safetensors dtype), shape (rank <= kMaxDims, integers
//     >= 0, product without int64 overflow) and data_offsets ([start, end],
//     end - start == numel * dtype size)
//   - sorted by start, the tensors tile the data buffer exactly: the first
//     starts at 0, each starts where the previous ends (no gap, no overlap),
//     and the last ends at the end of the file
//   - __metadata__, when present, is an object of string values
// Every error message names the file and the tensor or field.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor_view.h"

namespace qtk {

// note: the limit is the one the safetensors reference implementation uses.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsTensor {
  std::string name;
  TensorView view;           // points into the file mapping
  uint64_t file_offset = 0;  // of the first byte of data in the file
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws qtk::Error naming the file, the tensor
  // and the field on any problem.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  uint64_t file_size() const { return file_.size(); }
  uint64_t header_size() const { return header_size_; }  // N, the JSON bytes

  // In file order (ascending data offset).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // nullptr when there is no tensor of that name.
  const SafetensorsTensor* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // note: views stay valid while this object lives; the mapping address does
  // not change. Data is aligned to the element size only when the writer
  // padded the header (HF writers pad N to a multiple of 8); read unaligned
  // data with memcpy.

 private:
  SafetensorsFile() = default;
  MappedFile file_;
  uint64_t header_size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// True when `name` has a byte < 0x20, DEL, or a C1 control (U+0080..U+009F).
bool has_control_character(std::string_view name);

}  // namespace qtk
