// Fuzz entry: a .safetensors file (header length, JSON header, data buffer).
#include <cstring>

#include "core/error.h"
#include "loaders/safetensors.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/fuzz_util.h"

namespace qtk::fuzz {

int safetensors_header(const uint8_t* data, size_t size) {
  const std::string path = write_scratch_file("fuzz.safetensors", data, size);
  std::unique_ptr<SafetensorsFile> file;
  try {
    file = SafetensorsFile::open(path);
  } catch (const Error&) {
    return 0;  // rejected with a message: the expected answer to bad input
  }
  // Accepted: every promise of the header comment must hold.
  fuzz_check(file->file_size() == size, "file_size() differs from the bytes written");
  fuzz_check(file->header_size() <= kMaxSafetensorsHeaderBytes, "header over the limit accepted");
  fuzz_check(8 + file->header_size() <= size, "header runs past the end of the file");
  const uint64_t data_start = 8 + file->header_size();
  uint64_t expected_offset = data_start;
  const char* base = nullptr;
  for (const SafetensorsTensor& t : file->tensors()) {
    fuzz_check(!t.name.empty() && !has_control_character(t.name), "bad tensor name accepted");
    fuzz_check(file->find(t.name) == &t, "find() does not return the listed tensor");
    fuzz_check(t.view.ndim >= 0 && t.view.ndim <= kMaxDims, "rank out of range");
    for (int i = 0; i < t.view.ndim; ++i) fuzz_check(t.view.shape[i] >= 0, "negative dimension");
    const int64_t nbytes = t.view.nbytes();
    fuzz_check(nbytes >= 0, "negative byte size");
    fuzz_check(t.file_offset == expected_offset, "tensors do not tile the data buffer");
    expected_offset = t.file_offset + static_cast<uint64_t>(nbytes);
    fuzz_check(expected_offset <= size, "tensor data past the end of the file");
    const char* p = static_cast<const char*>(t.view.data);
    if (base == nullptr) base = p - t.file_offset;
    fuzz_check(p == base + t.file_offset, "view pointer does not match file_offset");
    if (nbytes > 0) {
      // Touch the first and last byte: a view outside the mapping faults here.
      char edge[2];
      std::memcpy(&edge[0], p, 1);
      std::memcpy(&edge[1], p + nbytes - 1, 1);
      (void)edge;
    }
  }
  fuzz_check(expected_offset == size, "trailing bytes after the last tensor accepted");
  for (const auto& [key, value] : file->metadata()) (void)key, (void)value;
  return 0;
}

}  // namespace qtk::fuzz
