#include "runtime/models/weight_binder.h"

#include <initializer_list>

#include "core/error.h"
#include "pack/pack.h"
#include "runtime/models/moe_weights.h"

namespace qtk {

namespace {

// note: F8_E4M3 matrices come with block scales (Pack::fp8_scales, checked
// when the pack opened); the binder hands the backends both (adopt_matrix,
// MoeWeights).
bool is_matrix_dtype(DType t) {
  return t == DType::BF16 || t == DType::F16 || t == DType::F32 || t == DType::F8_E4M3;
}

void check_shape(const Pack& pack, const std::string& name, const TensorView& v,
                 std::initializer_list<int64_t> dims) {
  bool ok = v.ndim == static_cast<int>(dims.size());
  int i = 0;
  for (int64_t d : dims) ok = ok && v.shape[i++] == d;
  if (!ok) {
    std::string want = "[";
    for (int64_t d : dims) want += (want.size() > 1 ? ", " : "") + std::to_string(d);
    fail("{}: tensor '{}' has shape {}; expected {} from the config", pack.path(), name,
         v.shape_string(), want + "]");
  }
}

const TensorView& f32_tensor(const Pack& pack, const std::string& name) {
  const TensorView& v = pack.tensor(name);
  if (v.dtype != DType::F32) {
    fail("{}: tensor '{}' has dtype {}; expected F32 (small tensors are always f32 in a pack)",
         pack.path(), name, dtype_name(v.dtype));
  }
  return v;
}

}  // namespace

const TensorView& pack_matrix_tensor(const Pack& pack, const std::string& name) {
  const TensorView& v = pack.tensor(name);
  if (!is_matrix_dtype(v.dtype)) {
    fail("{}: tensor '{}' has dtype {}; expected BF16, F16, F32 or F8_E4M3", pack.path(), name,
         dtype_name(v.dtype));
  }
  return v;
}

TensorView pack_matrix(const Pack& pack, const std::string& name, int64_t rows, int64_t cols) {
  const TensorView& v = pack_matrix_tensor(pack, name);
  check_shape(pack, name, v, {rows, cols});
  return v;
}

TensorView pack_vector(const Pack& pack, const std::string& name, int64_t n) {
  const TensorView& v = f32_tensor(pack, name);
  check_shape(pack, name, v, {n});
  return v;
}

const PackFp8Scales* pack_fp8_scales(const Pack& pack, const std::string& name,
                                     const TensorView& v) {
  if (v.dtype != DType::F8_E4M3) return nullptr;
  const PackFp8Scales* q = pack.fp8_scales(name);
  if (q == nullptr)
    fail("{}: tensor '{}' is F8_E4M3 but has no block scales in the manifest", pack.path(), name);
  return q;
}

WeightBinder::WeightBinder(const Pack& pack, TpRank tp)
    : pack_(pack), tp_(tp), cfg_(tp_rank_config(pack.config(), tp.size, pack.path())) {
  // note: every FP8 tensor's split is checked here, before any slice is
  // made, so a pack that does not split fails up front with one message
  // (the same on every rank).
  if (tp.split())
    for (const PackFp8Scales& q : pack.fp8_tensors())
      tp_check_fp8(q, split_of(q.tensor, q.weight), tp.size, pack.path());
}

TpSplit WeightBinder::split_of(const std::string& name, const TensorView& v) const {
  if (!tp_.split()) return {};
  const int64_t rows = v.ndim >= 2 ? v.shape[v.ndim - 2] : v.dim(0);
  return tp_split(pack_.config(), name, rows);
}

TensorView WeightBinder::rank_slice(const std::string& name, const TensorView& v) {
  if (!tp_.split()) return v;
  return tp_slice(v, split_of(name, v), tp_, name, slices_);
}

bool WeightBinder::has(const std::string& name) const { return pack_.find_tensor(name) != nullptr; }

// note: under tensor parallelism the whole tensor is checked against the
// pack's config first (tp_slice), then the slice against the rank's shape.
Matrix WeightBinder::matrix(const std::string& name, int64_t rows, int64_t cols, MatrixUse use) {
  const TensorView& full = pack_matrix_tensor(pack_, name);
  const TpSplit s = split_of(name, full);
  const TensorView v = tp_slice(full, s, tp_, name, slices_);
  check_shape(pack_, name, v, {rows, cols});
  const PackFp8Scales* fp8 = pack_fp8_scales(pack_, name, full);
  if (fp8 != nullptr) fp8 = tp_slice_fp8(*fp8, v, s, tp_, pack_.path(), slices_);
  if (v.data != full.data) release_source(full);
  const int32_t id = adopt_matrix(name, v, fp8, use);
  if (copies_on_adopt()) slices_.recycle();
  return Matrix{id, rows, cols};
}

Vector WeightBinder::vector(const std::string& name, int64_t n) {
  const TensorView v = rank_slice(name, f32_tensor(pack_, name));
  check_shape(pack_, name, v, {n});
  return Vector{adopt_vector(name, v), n};
}

Vector WeightBinder::table(const std::string& name, int64_t rows, int64_t cols) {
  const TensorView v = rank_slice(name, f32_tensor(pack_, name));
  check_shape(pack_, name, v, {rows, cols});
  return Vector{adopt_vector(name, v), rows * cols};
}

Experts WeightBinder::experts(const std::string& prefix) {
  MoeWeights w = load_moe_weights(pack_, pack_.config(), prefix);
  if (tp_.split()) {
    const MoeWeights full = w;
    w = tp_slice_experts(full, pack_.config(), tp_, prefix, pack_.path(), slices_);
    for (const TensorView* t :
         {&full.gate_up_proj, &full.down_proj, &full.shared_gate_up_proj, &full.shared_down_proj})
      if (t->data != nullptr) release_source(*t);
  }
  const int32_t id = adopt_experts(prefix, w);
  if (copies_on_adopt()) slices_.recycle();
  return Experts{id};
}

// note: a split tensor's pack pages are handed back once the rank has its
// slice (Pack::release_range): without that, a tensor-parallel load kept
// every split tensor's mapped pages in the process's RSS, the whole pack
// of a model larger than one GPU. Other ranks still slicing the same
// tensor fault its pages back in from the page cache.
void WeightBinder::release_source(const TensorView& full) const {
  pack_.release_range(full.data, static_cast<size_t>(full.nbytes()));
}

}  // namespace qtk
