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
#include "loaders/model_config.h"
#include "runtime/backend/blocks.h"
#include "runtime/parallel/tensor_parallel.h"

namespace qtk {

class Pack;
struct MoeWeights;
struct PackFp8Scales;

// What a matrix is used for: embedding rows are gathered, every other matrix
// is multiplied (the CPU backend makes tile-order copies of those only).
enum class MatrixUse { kEmbedding, kMatmul };

// note: tensor parallelism (runtime/parallel/tensor_parallel.h) happens
// here: a binder of rank r of N hands the backend rank r's slice of each
// tensor (an FP8 matrix's with the slice of its block scales), and config()
// is the rank's config (heads and widths / N), so the model files and the
// backends run unchanged on a rank.
class WeightBinder {
 public:
  // Throws qtk::Error when the pack does not split over tp.size ranks
  // (tp_rank_config; an FP8 tensor split inside its scale blocks:
  // tp_check_fp8).
  explicit WeightBinder(const Pack& pack, TpRank tp = {});
  virtual ~WeightBinder() = default;

  const Pack& pack() const { return pack_; }
  // The config the model is built with: the pack's, or a rank's.
  const ModelConfig& config() const { return cfg_; }
  TpRank tp() const { return tp_; }
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
  // come more than once (a tied lm_head is embed_tokens again). `fp8`: the
  // block scales of an F8_E4M3 matrix (nullptr for other dtypes), the
  // pack's own or, under tensor parallelism, the rank's slice of them
  // (valid, as are the slices, until release_slices()); a backend reads the
  // scales from here, never from the pack.
  virtual int32_t adopt_matrix(const std::string& name, const TensorView& v,
                               const PackFp8Scales* fp8, MatrixUse use) = 0;
  virtual int32_t adopt_vector(const std::string& name, const TensorView& v) = 0;
  virtual int32_t adopt_experts(const std::string& prefix, const MoeWeights& w) = 0;
  // Drops the rank's slice copies and their scales (a backend that copied
  // them elsewhere).
  void release_slices() { slices_.clear(); }
  // True for a backend whose adopt_* copies what it is given (the CUDA
  // upload): the binder then ends each slice right after its adopt_*
  // (TpStorage::recycle), so a rank never holds a host copy of more than one
  // tensor's slice.
  virtual bool copies_on_adopt() const { return false; }

 private:
  // The split of pack tensor `name` (view `v`); kNone when unsplit.
  TpSplit split_of(const std::string& name, const TensorView& v) const;
  // The rank's slice of `v` (pack tensor `name`); `v` itself when unsplit.
  TensorView rank_slice(const std::string& name, const TensorView& v);
  // Hands the pack pages of a split tensor back (see the note at its definition).
  void release_source(const TensorView& full) const;

  const Pack& pack_;
  TpRank tp_;
  ModelConfig cfg_;
  TpStorage slices_;  // the rank's slices of split tensors
};

// The checks WeightBinder makes, for code that reads a pack tensor directly.
// pack_matrix_tensor: a tensor in a matrix dtype (BF16, F16, F32, F8_E4M3),
// any shape.
const TensorView& pack_matrix_tensor(const Pack& pack, const std::string& name);
TensorView pack_matrix(const Pack& pack, const std::string& name, int64_t rows, int64_t cols);
TensorView pack_vector(const Pack& pack, const std::string& name, int64_t n);
// The block scales of pack tensor `name` (view `v`) when it is F8_E4M3, else
// nullptr; throws qtk::Error naming the pack and the tensor when an F8_E4M3
// tensor has none.
const PackFp8Scales* pack_fp8_scales(const Pack& pack, const std::string& name,
                                     const TensorView& v);

}  // namespace qtk
