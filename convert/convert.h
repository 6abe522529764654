// `convert`: a Hugging Face checkpoint (directory or archive) -> one .pack.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "convert/archive_extract.h"
#include "convert/tensor_plan.h"

namespace qtk {

struct ConvertOptions {
  std::string input;         // checkpoint directory or archive file
  std::string output;        // the .pack to create
  MatrixDType matrix_dtype;  // nullopt: keep the source dtype
  bool force = false;        // replace an existing output
  ArchiveLimits limits;
  // Progress lines (bytes done, total) while writing; empty for none.
  std::function<void(const std::string& line)> progress;
};

struct ConvertResult {
  uint64_t pack_bytes = 0;
  uint64_t tensor_bytes = 0;
  size_t tensors = 0;
  size_t entries = 0;
};

// Parses "keep" / "bf16" / "f16" / "f32"; throws qtk::Error otherwise.
MatrixDType parse_matrix_dtype(const std::string& text);

// Converts. On any failure throws qtk::Error and leaves no output file and
// no temporary file behind (see AtomicOutput).
ConvertResult convert_checkpoint(const ConvertOptions& options);

}  // namespace qtk
