// Binds a pack's tensors to a backend: the one place where a model file's
// weight schema (names, dtypes, shapes from the config) meets the pack. Each
// call checks the tensor and hands it to the backend (adopt_*), which keeps
// it in its own layout (the CPU backend: views into the mapped pack plus
// tile-order copies; the CUDA backend: device memory) and returns a handle
// that blocks (runtime/backend/blocks.h) take.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor_view.h"
#include "runtime/backend/blocks.h"

namespace qtk {

class Pack;
struct MoeWeights;

// What a matrix is used for: embedding rows are gathered, every other matrix
// is multiplied (the CPU backend makes tile-order copies of those only).
enum class MatrixUse { kEmbedding, kMatmul };

class WeightBinder {
 public:
  explicit WeightBinder(const Pack& pack) : pack_(pack) {}
  virtual ~WeightBinder() = default;

  const Pack& pack() const { return pack_; }
  bool has(const std::string& name) const;

  // A 2-D matrix in the pack's matrix dtype (BF16, F16, F32, or F8_E4M3 with
  // block scales). Throws qtk::Error naming the pack, the tensor, what was
  // expected and what was found.
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols,
                MatrixUse use = MatrixUse::kMatmul);
  // A float32 vector [n], or a float32 table [rows, cols].
  Vector vector(const std::string& name, int64_t n);
  Vector table(const std::string& name, int64_t rows, int64_t cols);
  // The mixture-of-experts block of layer `prefix` ("layers.3.").
  Experts experts(const std::string& prefix);

 protected:
  // The backend's side: keep the checked tensor, return its id. A name may
  // come more than once (a tied lm_head is embed_tokens again).
  virtual int32_t adopt_matrix(const std::string& name, const TensorView& v, MatrixUse use) = 0;
  virtual int32_t adopt_vector(const std::string& name, const TensorView& v) = 0;
  virtual int32_t adopt_experts(const std::string& prefix, const MoeWeights& w) = 0;

 private:
  const Pack& pack_;
};

// The checks WeightBinder makes, for code that reads a pack tensor directly.
TensorView pack_matrix(const Pack& pack, const std::string& name, int64_t rows, int64_t cols);
TensorView pack_vector(const Pack& pack, const std::string& name, int64_t n);

}  // namespace qtk
