#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tuning.h"
#include "kernels/cuda/compare.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv_mma.h"

namespace qtk::cuda {

using bf16 = __nv_bfloat16;
static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(LtAlgoBytes),
              "cublasLtMatmulAlgo_t is stored as 8 x uint64 (gemm_plan.h)");
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F32:
      return CUDA_R_32F;
    default:
      fail("Gemm: dtype {} is not supported (expected BF16 or F32)", dtype_name(t));
  }
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  QTK_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows),
                                              static_cast<uint64_t>(cols), ld));
  return l;
}

// A layout of `batch` matrices, matrix b at offset b * offset elements.
// note: the inputs' batches may overlap (an operand's K slices are column
// ranges of one row-major matrix: offset K / slices).
void set_batches(cublasLtMatrixLayout_t l, int32_t batch, int64_t offset) {
  QTK_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                    sizeof(batch)));
  QTK_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                    &offset, sizeof(offset)));
}

// The product's descriptor: f32 compute and scale, y^T = w x^T in cuBLASLt's
// column-major view (A = w transposed, B = x).
cublasLtMatmulDesc_t make_desc() {
  cublasLtMatmulDesc_t desc = nullptr;
  QTK_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  QTK_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  QTK_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  return desc;
}

// A preference for algorithms that need no workspace.
// note: views into activation buffers are only guaranteed 16-byte aligned.
cublasLtMatmulPreference_t no_workspace_preference() {
  cublasLtMatmulPreference_t pref = nullptr;
  QTK_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t no_workspace = 0;
  QTK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &no_workspace, sizeof(no_workspace)));
  const uint32_t align = 16;
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    QTK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  return pref;
}

// Asks `algo` for no split-K (one slice, no reduction scheme); returns the
// split-K count it reports afterwards (> 1: the algorithm must not be used).
// Algorithms without a split-K knob accept neither attribute; they never
// split K, so a failed set is fine as long as the count reads back <= 1.
int32_t disable_split_k(cublasLtMatmulAlgo_t& algo) {
  const int32_t splitk = 1;
  const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                       sizeof(splitk));
  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                       sizeof(scheme));
  int32_t got = 1;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &got,
                                           sizeof(got), &written) != CUBLAS_STATUS_SUCCESS)
    return 1;
  return got;
}

// The split-K count an algorithm is configured with (1 where it has no such knob).
int32_t split_k_of(const cublasLtMatmulAlgo_t& algo) {
  int32_t got = 1;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &got,
                                           sizeof(got), &written) != CUBLAS_STATUS_SUCCESS)
    return 1;
  return got;
}

}  // namespace

// Faster algorithms for small or large M, used only once verified bitwise
// equal to the plan algorithm (see Gemm::verify_range), or taken from a preloaded
// record of such a verification (Gemm::preload).
struct Gemm::PlanAlt {
  cublasLtMatmulAlgo_t algo{};
  int64_t lo = 0, hi = 0;                        // the M range it serves
  int64_t verify_m = 0;                          // the M of the equality check
  int64_t time_m = 0;                            // the M the candidates are timed at
  std::vector<int64_t> heuristics;               // the M whose heuristics offer candidates
  std::vector<cublasLtMatmulAlgo_t> candidates;  // until verified
  int algo_id = -1, tile = -1, stages = -1;
  bool usable = false;     // algo (a verified cuBLASLt alternate) serves the range
  bool own = false;        // the own skinny kernel (gemv_mma.cu) serves it, verified
  bool own_equal = false;  // the own kernel gave the plan algorithm's bits (maybe slower)
  bool checked = false;    // decided: tuned in this process or taken from a record
  bool cached = false;     // taken from a preloaded record
  std::string status = "not used yet";
};

// Column-major view of the row-major product: C[N, M] = op(A) B with
// A = w as col-major [K, N] (ld ldw), op = transpose; B = x as col-major
// [K, M] (ld ldx); C = y as col-major [N, M] (ld ldy).
// Sliced (slices > 1): the product of each K slice s, x[:, s klen ..] and
// w[:, s klen ..], is matrix s of one strided-batched call into f32 [slices]
// [M, N] (Gemm's workspace), and slice_sum adds them in slice order into y.
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;
  cudaDataType_t in_t{}, out_t{};
  int64_t k = 0, ldx = 0, ldw = 0, ldy = 0, n = 0;
  int slices = 1;
  int64_t klen = 0;  // k / slices
  cublasLtMatmulAlgo_t algo{};
  int algo_id = -1, tile = -1, stages = -1;
  int64_t probe_m = 0;  // the M whose heuristic offered the algorithm
  using Alt = PlanAlt;
  std::vector<Alt> alts;
  const void* w = nullptr;  // the weights of the first call (tune_remaining verifies on them)
  bool ok = true;           // false: no algorithm qualified (why says what was rejected)
  std::string why;
  std::map<int64_t, std::pair<cublasLtMatrixLayout_t, cublasLtMatrixLayout_t>> bc;  // per M

  ~Plan() {
    for (auto& [m, l] : bc) {
      cublasLtMatrixLayoutDestroy(l.first);
      cublasLtMatrixLayoutDestroy(l.second);
    }
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
  // The alternate range holding m, or null (alternates off).
  Alt* alt_for(int64_t m) {
    for (auto& a : alts)
      if (m >= a.lo && m <= a.hi) return &a;
    return nullptr;
  }
  const std::pair<cublasLtMatrixLayout_t, cublasLtMatrixLayout_t>& layouts(int64_t m) {
    auto it = bc.find(m);
    if (it == bc.end()) {
      std::pair<cublasLtMatrixLayout_t, cublasLtMatrixLayout_t> l;
      if (slices == 1) {
        l = {make_layout(in_t, k, m, ldx), make_layout(out_t, n, m, ldy)};
      } else {
        l = {make_layout(in_t, klen, m, ldx), make_layout(CUDA_R_32F, n, m, n)};
        set_batches(l.first, slices, klen);
        set_batches(l.second, slices, n * m);
      }
      it = bc.emplace(m, l).first;
    }
    return it->second;
  }
};

namespace {
static_assert(Tuning::kFusedMaxMMax == kGemvMaxM,
              "QTK_FUSED_MAX_M's limit is the own skinny kernel's largest M");

// QTK_FUSED_MAX_M (core/tuning.h): the largest M whose decode-step add +
// RMSNorm is fused into the next projection's launch (0..16, 0 = never;
// default 1).
// note: the fused launch computes its norm (formerly also the SwiGLU) in every block, before
// the product, so its cost grows with M; the separate launches compute each
// row once, and PDL overlaps them. On the H100 the separate launches were
// faster from M = 2 on (Qwen3-0.6B decode step with fusion up to 16 /
// none: batch 2 1.46 / 1.29 ms, 8 2.15 / 1.31, 16 3.44 / 1.46; Qwen3.5-0.8B
// batch 16 3.83 / 1.81), while at M = 1 the fused launch saves a launch.
// The own skinny kernel (gemv_mma.h) on bf16 x and w, y in `out`.
void own_gemv(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy,
              int64_t m, int64_t n, int64_t k, DType out, int slices, cudaStream_t stream) {
  const auto* xb = static_cast<const bf16*>(x);
  const auto* wb = static_cast<const bf16*>(w);
  if (out == DType::F32)
    gemv_bf16<float>(xb, ldx, wb, ldw, static_cast<float*>(y), ldy, m, n, k, stream, 0, slices);
  else
    gemv_bf16<bf16>(xb, ldx, wb, ldw, static_cast<bf16*>(y), ldy, m, n, k, stream, 0, slices);
}

// Output columns per block of a product too wide for any algorithm (a
// 151936-row lm_head): Gemm::run and Gemm::run_free split it into these.
constexpr int64_t kChunkN = 16384;

// The QTK_GEMM_FREE products' workspace (split-K partials).
constexpr size_t kFreeWorkBytes = size_t{32} << 20;

// note: the sliced products' f32 slice products live in one workspace of
// the Gemm (allocated up front: a decode graph may capture the first call);
// an M-row call runs in row blocks that fit it.
constexpr size_t kSliceWorkBytes = size_t{64} << 20;
}  // namespace

// QTK_GEMM_FREE: one cuBLASLt configuration per (shape, M), as an engine
// without the invariance guarantee would run it.
struct Gemm::Free {
  struct Entry {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
  };
  void* work = nullptr;
  std::map<std::tuple<Key, int64_t>, Entry> entries;
  ~Free() {
    for (auto& [key, e] : entries) {
      for (auto l : {e.a, e.b, e.c})
        if (l) cublasLtMatrixLayoutDestroy(l);
      if (e.desc) cublasLtMatmulDescDestroy(e.desc);
    }
    if (work) cudaFree(work);
  }
};

void Gemm::run_free(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy,
                    int64_t m, int64_t n, int64_t k, DType in, DType out, cudaStream_t stream) {
  auto lt = static_cast<cublasLtHandle_t>(handle_);
  const auto key =
      std::make_tuple(Key{n, k, ldx, ldw, ldy, static_cast<int>(in), static_cast<int>(out)}, m);
  auto it = free_->entries.find(key);
  if (it == free_->entries.end()) {
    Free::Entry e;
    e.desc = make_desc();
    e.a = make_layout(cuda_type(in), k, n, ldw);
    e.b = make_layout(cuda_type(in), k, m, ldx);
    e.c = make_layout(cuda_type(out), n, m, ldy);
    cublasLtMatmulPreference_t pref = no_workspace_preference();
    const uint64_t bytes = kFreeWorkBytes;
    QTK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    e.ok = cublasLtMatmulAlgoGetHeuristic(lt, e.desc, e.a, e.b, e.c, e.c, pref, 1, &r, &found) ==
               CUBLAS_STATUS_SUCCESS &&
           found > 0;
    cublasLtMatmulPreferenceDestroy(pref);
    if (e.ok) e.algo = r.algo;
    it = free_->entries.emplace(key, e).first;
  }
  const Free::Entry& e = it->second;
  if (!e.ok) {
    // (no algorithm for the whole width, e.g. a 151936-row lm_head: column blocks)
    if (n <= kChunkN)
      fail("Gemm (QTK_GEMM_FREE): no cuBLASLt algorithm for M {} N {} K {}", m, n, k);
    const int64_t wes = dtype_size(in), yes = dtype_size(out);
    for (int64_t off = 0; off < n; off += kChunkN)
      run_free(x, ldx, static_cast<const char*>(w) + off * ldw * wes, ldw,
               static_cast<char*>(y) + off * yes, ldy, m, std::min(kChunkN, n - off), k, in, out,
               stream);
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  if (cublasLtMatmul(lt, e.desc, &alpha, w, e.a, x, e.b, &beta, y, e.c, y, e.c, &e.algo,
                     free_->work, kFreeWorkBytes, stream) != CUBLAS_STATUS_SUCCESS)
    fail("Gemm (QTK_GEMM_FREE): cuBLASLt refused M {} N {} K {}", m, n, k);
}

Gemm::Gemm(int64_t ref_m, int slices)
    : ref_m_(ref_m > 0 ? ref_m : tuning().gemm_ref_m),
      slices_(slices > 0 ? slices : tuning().gemm_slices),
      alternates_(tuning().gemm_alternates),
      fused_max_m_(tuning().fused_max_m) {
  if (slices_ != 1 && slices_ != kGemvSlices)
    fail("Gemm: {} K slices (expected 1 or {})", slices_, kGemvSlices);
  cublasLtHandle_t h = nullptr;
  QTK_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
  if (slices_ > 1) QTK_CUDA_CHECK(cudaMalloc(&work_, kSliceWorkBytes));
  if (tuning().gemm_free) {
    free_ = std::make_unique<Free>();
    QTK_CUDA_CHECK(cudaMalloc(&free_->work, kFreeWorkBytes));
  }
}

Gemm::~Gemm() {
  plans_.clear();
  free_.reset();
  if (work_ != nullptr) cudaFree(work_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

int Gemm::slices_for(int64_t n, int64_t k, DType in, DType out) const {
  return slices_ > 1 && in == DType::BF16 && out == DType::BF16 && k >= kSliceMinK &&
                 n <= kSliceMaxN && gemv_slices_supported(k, slices_)
             ? slices_
             : 1;
}

bool Gemm::lt_run(Plan& p, const void* algo_ptr, const void* x, const void* w, void* y, int64_t m,
                  cudaStream_t stream) {
  auto lt = static_cast<cublasLtHandle_t>(handle_);
  const auto* algo = static_cast<const cublasLtMatmulAlgo_t*>(algo_ptr);
  const float alpha = 1.0f, beta = 0.0f;
  if (p.slices == 1) {
    const auto& l = p.layouts(m);
    return cublasLtMatmul(lt, p.desc, &alpha, w, p.a, x, l.first, &beta, y, l.second, y, l.second,
                          algo, nullptr, 0, stream) == CUBLAS_STATUS_SUCCESS;
  }
  // (sliced plans are bf16 -> bf16 only: slices_for)
  const int64_t block = std::max<int64_t>(
      1, static_cast<int64_t>(kSliceWorkBytes / (sizeof(float) * p.slices * p.n)));
  for (int64_t r0 = 0; r0 < m; r0 += block) {
    const int64_t rows = std::min(block, m - r0);
    const auto& l = p.layouts(rows);
    if (cublasLtMatmul(lt, p.desc, &alpha, w, p.a, static_cast<const bf16*>(x) + r0 * p.ldx,
                       l.first, &beta, work_, l.second, work_, l.second, algo, nullptr, 0,
                       stream) != CUBLAS_STATUS_SUCCESS)
      return false;
    slice_sum<bf16>(static_cast<const float*>(work_), p.slices, rows * p.n,
                    static_cast<bf16*>(y) + r0 * p.ldy, p.ldy, rows, p.n, stream);
  }
  return true;
}

Gemm::Plan& Gemm::plan(int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldy, DType in,
                       DType out) {
  const Key key{n, k, ldx, ldw, ldy, static_cast<int>(in), static_cast<int>(out)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  if (in == DType::F32 && out != DType::F32)
    fail("Gemm: F32 inputs need an F32 output, got {}", dtype_name(out));
  const auto t0 = Clock::now();
  auto p = std::make_unique<Plan>();
  auto lt = static_cast<cublasLtHandle_t>(handle_);
  p->in_t = cuda_type(in);
  p->out_t = cuda_type(out);
  p->k = k;
  p->n = n;
  p->ldx = ldx;
  p->ldw = ldw;
  p->ldy = ldy;
  p->slices = slices_for(n, k, in, out);
  p->klen = k / p->slices;
  p->desc = make_desc();
  p->a = make_layout(p->in_t, p->klen, n, ldw);
  if (p->slices > 1) set_batches(p->a, p->slices, p->klen);

  cublasLtMatmulPreference_t pref = no_workspace_preference();

  // note: candidates come from the heuristic for M = ref_m first; when none
  // of them runs split-K-free at both M = 1 and M = ref_m (seen for very wide
  // N such as a 151936-row lm_head), the heuristics for M = 1 and M = 4*ref_m
  // are tried next. The choice depends on the shape class only, never on the
  // M of a call.
  const auto& one = p->layouts(1);
  const auto& ref = p->layouts(ref_m_);
  constexpr int kWanted = 32;
  int found_total = 0;
  bool chosen = false;
  std::string why;  // the first few rejections, for the error message
  for (int64_t probe_m : {ref_m_, int64_t{1}, 4 * ref_m_}) {
    const auto& probe = p->layouts(probe_m);
    std::vector<cublasLtMatmulHeuristicResult_t> results(kWanted);
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->a, probe.first, probe.second, probe.second,
                                       pref, kWanted, results.data(),
                                       &found) != CUBLAS_STATUS_SUCCESS)
      continue;
    found_total += found;
    for (int i = 0; i < found && !chosen; ++i) {
      cublasLtMatmulAlgo_t algo = results[i].algo;
      const int32_t got_splitk = disable_split_k(algo);
      if (got_splitk > 1) {
        if (why.size() < 300) why += fmt::format(" [{}: split-K {}]", i, got_splitk);
        continue;
      }
      // The same algorithm must serve M = 1 (decode) and M = ref_m, with no
      // workspace (none is given at run time).
      cublasLtMatmulHeuristicResult_t check{};
      bool ok = true;
      for (const auto* l : {&one, &ref}) {
        const cublasStatus_t st = cublasLtMatmulAlgoCheck(lt, p->desc, p->a, l->first, l->second,
                                                          l->second, &algo, &check);
        if (st != CUBLAS_STATUS_SUCCESS || check.workspaceSize != 0) {
          if (why.size() < 300)
            why += fmt::format(" [{}: check status {} workspace {}]", i, static_cast<int>(st),
                               check.workspaceSize);
          ok = false;
          break;
        }
      }
      if (!ok) continue;
      p->algo = algo;
      p->probe_m = probe_m;
      chosen = true;
    }
    if (chosen) break;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (!chosen) {
    p->ok = false;
    p->why = fmt::format(
        "Gemm: cuBLASLt offers no split-K-free algorithm for N {} K {} ({} -> {}) "
        "among {} candidates:{}",
        n, k, dtype_name(in), dtype_name(out), found_total, why);
    // A record for this shape class claims an algorithm that this cuBLASLt
    // does not offer: it does not apply.
    if (presets_.erase(key) > 0) ++stats_.records_stale;
    stats_.seconds += seconds_since(t0);
    return *plans_.emplace(key, std::move(p)).first->second;
  }
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &p->algo_id,
                                       sizeof(p->algo_id), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &p->tile,
                                       sizeof(p->tile), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &p->stages,
                                       sizeof(p->stages), &written);
  if (alternates_) {
    init_ranges(*p);
    if (auto pre = presets_.find(key); pre != presets_.end()) {
      apply_record(*p, pre->second);
      presets_.erase(pre);
    }
  }
  stats_.seconds += seconds_since(t0);
  return *plans_.emplace(key, std::move(p)).first->second;
}

// The alternate M ranges, not yet searched (find_candidates) or verified
// (verify_range): both happen the first time a call falls into the range.
// note: lazily per range because each range's search and timing costs
// start-up time (each candidate is run ~20 times at the range's probe M);
// a run that never reaches a range (batch 1 never uses 17..64) never pays
// for it. The decision for a range does not depend on when it is made.
void Gemm::init_ranges(Plan& p) {
  struct Range {
    int64_t probe, lo, hi, verify;
    std::vector<int64_t> heuristics;  // the M whose heuristics offer candidates
  };
  for (const Range& r :
       {Range{1, 1, kSmallMaxM, kSmallMaxM, {1, 8}}, Range{32, kSmallMaxM + 1, 64, 64, {32, 64}},
        Range{128, 65, kLargeMinM - 1, kLargeMinM - 1, {128, 256}},
        Range{kLargeMinM, kLargeMinM, kHugeMinM - 1, kLargeMinM, {512, 1024}},
        Range{kHugeMinM, kHugeMinM, kGemmOpenRangeEnd, kHugeMinM, {512, 2048, 8192}}}) {
    Plan::Alt alt;
    alt.lo = r.lo;
    alt.hi = r.hi;
    alt.verify_m = r.verify;
    alt.time_m = r.probe;
    alt.heuristics = r.heuristics;
    p.alts.push_back(std::move(alt));
  }
}

// True when cuBLASLt accepts `algo` for every M the range is checked at
// (its ends, its verify and probe M; the open last range at its start),
// with no workspace.
bool Gemm::runs_over_range(Plan& p, const PlanAlt& alt, const void* algo_ptr) {
  auto lt = static_cast<cublasLtHandle_t>(handle_);
  const auto& algo = *static_cast<const cublasLtMatmulAlgo_t*>(algo_ptr);
  bool ok = true;
  for (int64_t m :
       {alt.lo, alt.verify_m, alt.time_m, alt.hi == kGemmOpenRangeEnd ? alt.lo : alt.hi}) {
    const auto& l = p.layouts(m);
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(lt, p.desc, p.a, l.first, l.second, l.second, &algo, &check) !=
            CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize != 0)
      ok = false;
  }
  return ok;
}

// Takes the decisions of a record (what an earlier tuning chose for this
// shape class) for the ranges it holds, where they still apply here.
// note: exactness. The record is used only when this process chose the same
// plan algorithm (the one that serves every M and defines the bits): then a
// recorded alternate is one that gave exactly that algorithm's bits when it
// was verified, on the same GPU, driver, CUDA and cuBLASLt versions and own
// kernel (the plan cache's key), and it gives them again here. A recorded
// cuBLASLt alternate must still pass cuBLASLt's own check at the range's M
// values with no workspace and no split-K; anything that does not fit is
// left to be tuned (records_stale counts it).
void Gemm::apply_record(Plan& p, const GemmPlanRecord& r) {
  if (std::memcmp(r.algo.data(), &p.algo, sizeof(p.algo)) != 0) {
    ++stats_.records_stale;
    return;
  }
  const bool bf16_in = p.in_t == CUDA_R_16BF;
  for (const GemmRangeChoice& c : r.ranges) {
    Plan::Alt* alt = nullptr;
    for (auto& a : p.alts)
      if (a.lo == c.lo && a.hi == c.hi) alt = &a;
    bool valid = alt != nullptr && !alt->checked;
    // The own kernel serves only the smallest range of bf16 products, and
    // serves it only where it was bit-equal.
    if (valid && c.own_equal) valid = bf16_in && alt->lo == 1;
    if (valid && c.use == GemmRangeChoice::Use::kOwn) valid = c.own_equal;
    cublasLtMatmulAlgo_t algo{};
    if (valid && c.use == GemmRangeChoice::Use::kLt) {
      std::memcpy(&algo, c.algo.data(), sizeof(algo));
      valid = std::memcmp(&algo, &p.algo, sizeof(algo)) != 0 && split_k_of(algo) <= 1 &&
              runs_over_range(p, *alt, &algo);
    }
    if (!valid) {
      ++stats_.records_stale;
      continue;
    }
    alt->checked = alt->cached = true;
    alt->own_equal = c.own_equal;
    alt->own = c.use == GemmRangeChoice::Use::kOwn;
    alt->usable = c.use == GemmRangeChoice::Use::kLt;
    if (alt->usable) {
      alt->algo = algo;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&alt->algo, CUBLASLT_ALGO_CONFIG_ID, &alt->algo_id,
                                           sizeof(alt->algo_id), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&alt->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &alt->tile,
                                           sizeof(alt->tile), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&alt->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &alt->stages,
                                           sizeof(alt->stages), &written);
    }
    alt->status = "from the plan cache";
    ++stats_.ranges_cached;
  }
}

void Gemm::preload(const std::vector<GemmPlanRecord>& records) {
  for (const GemmPlanRecord& r : records) {
    const Key key{r.n, r.k, r.ldx, r.ldw, r.ldy, static_cast<int>(r.in), static_cast<int>(r.out)};
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      presets_[key] = r;
    } else if (alternates_ && it->second->ok) {
      apply_record(*it->second, r);
    } else {
      ++stats_.records_stale;
    }
  }
}

std::vector<GemmPlanRecord> Gemm::records() const {
  std::vector<GemmPlanRecord> out;
  for (const auto& [key, p] : plans_) {
    if (!p->ok) continue;
    GemmPlanRecord r;
    r.n = p->n;
    r.k = p->k;
    r.ldx = p->ldx;
    r.ldw = p->ldw;
    r.ldy = p->ldy;
    r.in = static_cast<DType>(std::get<5>(key));
    r.out = static_cast<DType>(std::get<6>(key));
    std::memcpy(r.algo.data(), &p->algo, sizeof(p->algo));
    for (const auto& a : p->alts) {
      if (!a.checked) continue;
      GemmRangeChoice c;
      c.lo = a.lo;
      c.hi = a.hi;
      c.use = a.own      ? GemmRangeChoice::Use::kOwn
              : a.usable ? GemmRangeChoice::Use::kLt
                         : GemmRangeChoice::Use::kPlan;
      if (a.usable && !a.own) std::memcpy(c.algo.data(), &a.algo, sizeof(a.algo));
      c.own_equal = a.own_equal;
      r.ranges.push_back(c);
    }
    if (!r.ranges.empty()) out.push_back(std::move(r));
  }
  // note: records of shape classes this process never met stay, so that a
  // cache file keeps what other runs (other batch sizes) tuned.
  for (const auto& [key, r] : presets_) out.push_back(r);
  return out;
}

void Gemm::tune_range(Plan& p, PlanAlt& alt, const void* w, cudaStream_t stream) {
  // note: the check needs a synchronous stream; inside a graph capture the
  // plan algorithm serves the range until the next call outside one.
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  QTK_CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
  if (cap != cudaStreamCaptureStatusNone) return;
  // (the work queued before is not tuning's time)
  QTK_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto t0 = Clock::now();
  alt.checked = true;
  find_candidates(p, alt);
  verify_range(p, alt, w, stream);
  ++stats_.ranges_tuned;
  stats_.seconds += seconds_since(t0);
}

void Gemm::tune_remaining(cudaStream_t stream) {
  for (auto& [key, p] : plans_) {
    if (!p->ok || p->w == nullptr) continue;
    for (auto& alt : p->alts)
      if (!alt.checked) tune_range(*p, alt, p->w, stream);
  }
}

// note: candidates for M <= 16 (cuBLASLt's heuristics for M = 1 and 8),
// 17..64 (M = 32, 64: batch-32 decode), 65..511 (M = 128, 256: batch-128
// decode), 512..2047 (M = 512, 1024: prefill steps of generate's default
// 512-token budget) and M >= 2048 (M = 512, 2048, 8192: larger prefill
// steps): up to 8 split-K-free, workspace-free algorithms per heuristic
// other than the plan's own that run at the range's ends (the open last
// range: at 2048), each timed at the range's probe M.
// note: the prefill is split in two ranges because one range 512.., timed
// at M 2048, made a 512-token step run the kernel fastest for 2048 rows;
// timed at 512, the pp512 prefill ran 9% faster on Qwen3-0.6B and 5% on
// Qwen3.5-0.8B (same call). The range from 2048 is checked at 2048 and
// timed at 4096: checked also at 8192 and timed at 4096, it kept 5 of
// N 1024 K 3072's 15 candidates and none of N 3072 K 1024's, and Qwen3-8B's
// batch-128 prefill (M 8192 steps) took 541 ms instead of 420. The H100
// end-to-end runs use M up to 8192 with these algorithms.
// None is used before verify_range has compared it with the plan's.
void Gemm::find_candidates(Plan& p, PlanAlt& alt) {
  auto lt = static_cast<cublasLtHandle_t>(handle_);
  cublasLtMatmulPreference_t pref = no_workspace_preference();
  constexpr int kCandidates = 8;
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  for (int64_t hm : alt.heuristics) {
    const auto& probe = p.layouts(hm);
    std::vector<cublasLtMatmulHeuristicResult_t> got(kCandidates);
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, probe.first, probe.second, probe.second,
                                       pref, kCandidates, got.data(),
                                       &found) == CUBLAS_STATUS_SUCCESS)
      results.insert(results.end(), got.begin(), got.begin() + found);
  }
  int same = 0, split = 0, refused = 0;
  for (const auto& res : results) {
    cublasLtMatmulAlgo_t algo = res.algo;
    bool seen = std::memcmp(&algo, &p.algo, sizeof(algo)) == 0;
    for (const auto& c : alt.candidates) seen = seen || std::memcmp(&algo, &c, sizeof(c)) == 0;
    if (seen) {
      ++same;
      continue;
    }
    if (disable_split_k(algo) > 1) {
      ++split;
      continue;
    }
    if (runs_over_range(p, alt, &algo))
      alt.candidates.push_back(algo);
    else
      ++refused;
  }
  alt.status = fmt::format("{} offered: {} repeats, {} split-K, {} refused at some M",
                           results.size(), same, split, refused);
  cublasLtMatmulPreferenceDestroy(pref);
}

// note: batch invariance with several algorithms. An alternate serves its M
// range only after it produced, on this GPU, bit-for-bit the plan
// algorithm's output for the same inputs: the real weights and verify_m rows
// of random activations over the full N and K. Two kernels that walk K in
// the same order with the same instructions agree on every input; any
// difference in the reduction order shows up in such a check with
// overwhelming probability (each of the verify_m * N outputs is a K-term
// sum). Among the candidates that pass, the fastest at time_m rows is kept if
// it beats the plan's algorithm there by 5%; the rest are dropped for the
// process. tests/cuda/test_gemm.cpp compares rows of M = 1..1024 products
// across the ranges. The check needs a synchronous stream, so it runs at the
// first call in the range outside graph capture (tune_range); until then the
// plan algorithm serves the range.
void Gemm::verify_range(Plan& p, PlanAlt& alt, const void* w, cudaStream_t stream) {
  // note: each candidate is timed over kTimedRuns back-to-back calls at the
  // range's probe M (5 runs picked a slower kernel now and then).
  constexpr int kTimedRuns = 20;
  const size_t in_es = p.in_t == CUDA_R_16BF ? 2 : 4, out_es = p.out_t == CUDA_R_16BF ? 2 : 4;
  constexpr size_t kFlushBytes = size_t{64} << 20;
  if (alt.candidates.empty()) return;  // status says why
  void* flush = nullptr;
  const int64_t rows = std::max(alt.verify_m, alt.time_m);
  std::vector<unsigned char> xh(static_cast<size_t>(rows * p.ldx) * in_es, 0);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (int64_t i = 0; i < rows * p.ldx; ++i) {
    const float f = dist(rng);
    if (in_es == 4) {
      std::memcpy(&xh[i * 4], &f, 4);
    } else {  // round to nearest even bf16
      uint32_t u;
      std::memcpy(&u, &f, 4);
      const uint16_t h = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      std::memcpy(&xh[i * 2], &h, 2);
    }
  }
  const size_t y_bytes = static_cast<size_t>(rows * p.ldy) * out_es;
  void *xd = nullptr, *y0 = nullptr, *y1 = nullptr;
  unsigned long long* differ_d = nullptr;
  QTK_CUDA_CHECK(cudaMalloc(&xd, xh.size()));
  QTK_CUDA_CHECK(cudaMalloc(&y0, y_bytes));
  QTK_CUDA_CHECK(cudaMalloc(&y1, y_bytes));
  QTK_CUDA_CHECK(cudaMalloc(&differ_d, sizeof(unsigned long long)));
  QTK_CUDA_CHECK(cudaMemcpyAsync(xd, xh.data(), xh.size(), cudaMemcpyHostToDevice, stream));
  cudaEvent_t e0, e1;
  QTK_CUDA_CHECK(cudaEventCreate(&e0));
  QTK_CUDA_CHECK(cudaEventCreate(&e1));
  // note: a candidate that does not run is just not used (no throw).
  auto mm = [&](const cublasLtMatmulAlgo_t* algo, int64_t m, void* y) {
    return lt_run(p, algo, xd, w, y, m, stream);
  };
  // note: the decode ranges (M < kLargeMinM: a decode step's products) are
  // timed with the weights out of L2, as in a step, where each layer's
  // weights are read once: a kFlushBytes write between runs evicts them.
  // Back to back, a product whose weights fit the 50 MB L2 is timed at L2
  // speed, which is not what a step sees (on the H100 the cold timing
  // moved Qwen3-0.6B's qkv and gate_up products from the own kernel to
  // cuBLASLt; with warm timing of M 65..511 the batch-128 lm_head
  // blocks ran on 19 us kernels in one process and on 27 us ones in the
  // next).
  const bool cold = alt.hi < kLargeMinM;
  if (cold && flush == nullptr) QTK_CUDA_CHECK(cudaMalloc(&flush, kFlushBytes));
  auto timed = [&](const auto& run) {
    run();  // warm-up
    float total = 0;
    for (int i = 0; i < kTimedRuns; ++i) {
      if (cold) QTK_CUDA_CHECK(cudaMemsetAsync(flush, i, kFlushBytes, stream));
      if (cold || i == 0) QTK_CUDA_CHECK(cudaEventRecord(e0, stream));
      run();
      if (cold || i + 1 == kTimedRuns) {
        QTK_CUDA_CHECK(cudaEventRecord(e1, stream));
        QTK_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        QTK_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        total += ms;
      }
    }
    return total;
  };
  auto time_of = [&](const cublasLtMatmulAlgo_t* algo) {
    if (!mm(algo, alt.time_m, y1)) return 1e30f;
    return timed([&] { mm(algo, alt.time_m, y1); });
  };
  // Whether the first m rows of y1 hold y0's bits. Only the N columns of
  // each row are outputs (ldy may pad).
  // note: compared on the device: copying both products to the host took
  // rows x ldy x 4 bytes twice per candidate (for a vocabulary-wide f32
  // lm_head at the 2048.. range: two 2 GB host buffers, most of a run's
  // peak RSS, and seconds of transfers at start-up).
  auto same_as_plan = [&](int64_t m) {
    unsigned long long differ = 0;
    QTK_CUDA_CHECK(cudaMemsetAsync(differ_d, 0, sizeof(differ), stream));
    count_differing_words(y0, y1, m, p.n * static_cast<int64_t>(out_es),
                          p.ldy * static_cast<int64_t>(out_es), differ_d, stream);
    QTK_CUDA_CHECK(
        cudaMemcpyAsync(&differ, differ_d, sizeof(differ), cudaMemcpyDeviceToHost, stream));
    QTK_CUDA_CHECK(cudaStreamSynchronize(stream));
    return differ == 0;
  };
  QTK_CUDA_CHECK(cudaMemsetAsync(y0, 0, y_bytes, stream));
  const bool plan_runs = mm(&p.algo, alt.verify_m, y0);
  const float plan_ms = time_of(&p.algo);
  if (!plan_runs) alt.candidates.clear();
  float best_ms = plan_ms * 0.95f;
  int verified = 0;
  for (const auto& cand : alt.candidates) {
    QTK_CUDA_CHECK(cudaMemsetAsync(y1, 0xff, y_bytes, stream));
    if (!mm(&cand, alt.verify_m, y1)) continue;
    if (!same_as_plan(alt.verify_m)) continue;
    ++verified;
    const float ms = time_of(&cand);
    if (ms < best_ms) {
      best_ms = ms;
      alt.algo = cand;
      alt.usable = true;
    }
  }
  // note: the own skinny kernel (gemv_mma.cu) competes for the small-M
  // range of bf16 products on the same terms: bit-equal to the plan
  // algorithm at 8 and at verify_m rows (its two token-tile variants), then
  // faster at time_m.
  std::string own_status;
  if (alt.lo == 1 && p.in_t == CUDA_R_16BF && plan_runs &&
      gemv_bf16_supported(xd, p.ldx, w, p.ldw, alt.verify_m, p.k)) {
    const DType out = p.out_t == CUDA_R_32F ? DType::F32 : DType::BF16;
    auto own = [&](int64_t m, void* y) {
      own_gemv(xd, p.ldx, w, p.ldw, y, p.ldy, m, p.n, p.k, out, p.slices, stream);
    };
    bool same = true;
    for (const int64_t m : {std::min<int64_t>(8, alt.verify_m), alt.verify_m}) {
      QTK_CUDA_CHECK(cudaMemsetAsync(y1, 0xff, y_bytes, stream));
      own(m, y1);
      same = same_as_plan(m) && same;
    }
    alt.own_equal = same;
    if (same) {
      const float ms = timed([&] { own(alt.time_m, y1); });
      own_status = fmt::format("; own kernel bit-equal, {:.1f} us", 1000.0f * ms / kTimedRuns);
      if (ms < best_ms) {
        best_ms = ms;
        alt.own = true;
      }
    } else {
      own_status = "; own kernel not bit-equal";
    }
  }
  QTK_CUDA_CHECK(cudaEventDestroy(e0));
  QTK_CUDA_CHECK(cudaEventDestroy(e1));
  QTK_CUDA_CHECK(cudaFree(xd));
  QTK_CUDA_CHECK(cudaFree(y0));
  QTK_CUDA_CHECK(cudaFree(y1));
  QTK_CUDA_CHECK(cudaFree(differ_d));
  if (alt.usable) {
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&alt.algo, CUBLASLT_ALGO_CONFIG_ID, &alt.algo_id,
                                         sizeof(alt.algo_id), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&alt.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &alt.tile,
                                         sizeof(alt.tile), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&alt.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &alt.stages,
                                         sizeof(alt.stages), &written);
  }
  alt.status = fmt::format("{} of {} candidates bit-equal{}; M {}: {:.1f} us vs {:.1f} us",
                           verified, alt.candidates.size(), own_status, alt.time_m,
                           1000.0f * (alt.usable || alt.own ? best_ms : plan_ms) / kTimedRuns,
                           1000.0f * plan_ms / kTimedRuns);
  alt.candidates.clear();
  if (flush != nullptr) QTK_CUDA_CHECK(cudaFree(flush));
}

void Gemm::run(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy,
               int64_t m, int64_t n, int64_t k, DType in, DType out, cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  for (const void* ptr : {x, w, static_cast<const void*>(y)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      fail("Gemm: pointer {} is not 16-byte aligned", ptr);
  if (free_) return run_free(x, ldx, w, ldw, y, ldy, m, n, k, in, out, stream);
  Plan& p = plan(n, k, ldx, ldw, ldy, in, out);
  if (!p.ok) {
    // note: some very wide products (a 151936-row lm_head) get no
    // qualifying algorithm; they run as column blocks of kChunkN output
    // columns. Each output element is still one K reduction by one fixed
    // algorithm, and the split depends on N only, so invariance holds.
    if (n <= kChunkN) fail("{}", p.why);
    // note: at M <= 16 the own skinny kernel takes the whole width in one
    // launch where it gave, on this GPU, the bits of the plan algorithms of
    // both chunk widths (the full one and the last): each output is then
    // the same chain as in the chunked product. One launch instead of ten
    // for a 151936-row lm_head (H100, same call, against the chunks:
    // Qwen3.5-0.8B batch 1 1.18 vs 1.23 ms per step, Qwen3-0.6B 1.09 vs
    // 1.10; batch 8 and 16 within the runs' spread).
    const int64_t wes = dtype_size(in), yes = dtype_size(out);
    const int64_t last = n % kChunkN == 0 ? kChunkN : n % kChunkN;
    // (one launch needs one order: both chunk widths sliced alike)
    const int slices = slices_for(kChunkN, k, in, out);
    if (in == DType::BF16 && m <= kSmallMaxM && gemv_bf16_supported(x, ldx, w, ldw, m, k) &&
        slices == slices_for(last, k, in, out) &&
        own_bit_equal(m, kChunkN, k, ldx, w, ldw, ldy, out, stream) &&
        own_bit_equal(m, last, k, ldx, static_cast<const char*>(w) + (n - last) * ldw * wes, ldw,
                      ldy, out, stream)) {
      own_gemv(x, ldx, w, ldw, y, ldy, m, n, k, out, slices, stream);
      return;
    }
    for (int64_t off = 0; off < n; off += kChunkN)
      run(x, ldx, static_cast<const char*>(w) + off * ldw * wes, ldw,
          static_cast<char*>(y) + off * yes, ldy, m, std::min(kChunkN, n - off), k, in, out,
          stream);
    return;
  }
  if (p.w == nullptr) p.w = w;
  const cublasLtMatmulAlgo_t* algo = &p.algo;
  if (Plan::Alt* alt = p.alt_for(m)) {
    if (!alt->checked) tune_range(p, *alt, w, stream);
    if (alt->own && gemv_bf16_supported(x, ldx, w, ldw, m, k)) {
      own_gemv(x, ldx, w, ldw, y, ldy, m, n, k, out, p.slices, stream);
      return;
    }
    if (alt->usable) algo = &alt->algo;
  }
  if (!lt_run(p, algo, x, w, y, m, stream))
    fail("Gemm: cuBLASLt refused the product M {} N {} K {} ({} -> {}, {} K slices)", m, n, k,
         dtype_name(in), dtype_name(out), p.slices);
}

bool Gemm::own_bit_equal(int64_t m, int64_t n, int64_t k, int64_t ldx, const void* w, int64_t ldw,
                         int64_t ldy, DType out, cudaStream_t stream) {
  // (QTK_GEMM_FREE: no own kernel, so none of the fused launches either)
  if (free_ || m < 1 || m > kSmallMaxM || n == 0) return false;
  Plan& p = plan(n, k, ldx, ldw, ldy, DType::BF16, out);
  if (!p.ok) return false;
  if (p.w == nullptr) p.w = w;
  Plan::Alt* alt = p.alt_for(m);
  if (alt == nullptr) return false;
  if (!alt->checked) tune_range(p, *alt, w, stream);
  return alt->own_equal;
}

bool Gemm::run_add_rmsnorm(const AddRmsNormInput& an, const void* w, int64_t ldw, void* y,
                           int64_t ldy, int64_t m, int64_t n, int64_t k, DType out,
                           cudaStream_t stream) {
  // The shape class of the unfused call: x = the normed rows, stride ldd.
  if (m > fused_max_m_ || !own_bit_equal(m, n, k, an.ldd, w, ldw, ldy, out, stream) ||
      !add_rmsnorm_gemv_supported(an, w, ldw, m, k))
    return false;
  const auto* wb = static_cast<const bf16*>(w);
  const int slices = slices_for(n, k, DType::BF16, out);
  if (out == DType::F32)
    add_rmsnorm_gemv_bf16<float>(an, wb, ldw, static_cast<float*>(y), ldy, m, n, k, stream, slices);
  else
    add_rmsnorm_gemv_bf16<bf16>(an, wb, ldw, static_cast<bf16*>(y), ldy, m, n, k, stream, slices);
  return true;
}

bool Gemm::run_own(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy,
                   int64_t m, int64_t n, int64_t k, DType out, cudaStream_t stream) {
  if (!own_bit_equal(m, n, k, ldx, w, ldw, ldy, out, stream) ||
      !gemv_bf16_supported(x, ldx, w, ldw, m, k))
    return false;
  own_gemv(x, ldx, w, ldw, y, ldy, m, n, k, out, slices_for(n, k, DType::BF16, out), stream);
  return true;
}

bool Gemm::run_swiglu_out(const void* x, int64_t ldx, const void* w, int64_t ldw, void* act,
                          int64_t ldact, int64_t m, int64_t inter, int64_t k, int64_t ld_gate_up,
                          cudaStream_t stream) {
  // (the SwiGLU epilogue has no sliced form)
  if (slices_for(2 * inter, k, DType::BF16, DType::BF16) > 1 ||
      !own_bit_equal(m, 2 * inter, k, ldx, w, ldw, ld_gate_up, DType::BF16, stream) ||
      !gemv_bf16_supported(x, ldx, w, ldw, m, k))
    return false;
  gemv_swiglu_out_bf16(static_cast<const bf16*>(x), ldx, static_cast<const bf16*>(w), ldw,
                       static_cast<bf16*>(act), ldact, m, inter, k, stream);
  return true;
}

bool Gemm::run_add_rmsnorm_swiglu_out(const AddRmsNormInput& an, const void* w, int64_t ldw,
                                      void* act, int64_t ldact, int64_t m, int64_t inter, int64_t k,
                                      int64_t ld_gate_up, cudaStream_t stream) {
  if (m > fused_max_m_ || slices_for(2 * inter, k, DType::BF16, DType::BF16) > 1 ||
      !own_bit_equal(m, 2 * inter, k, an.ldd, w, ldw, ld_gate_up, DType::BF16, stream) ||
      !add_rmsnorm_gemv_supported(an, w, ldw, m, k))
    return false;
  add_rmsnorm_gemv_swiglu_out_bf16(an, static_cast<const bf16*>(w), ldw, static_cast<bf16*>(act),
                                   ldact, m, inter, k, stream);
  return true;
}

std::string Gemm::describe(int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldy, DType in,
                           DType out) {
  const Plan& p = plan(n, k, ldx, ldw, ldy, in, out);
  if (!p.ok) return fmt::format("column blocks of 16384 ({})", p.why.substr(0, 120));
  std::string d = fmt::format("algo {} tile {} stages {} (heuristic of M {})", p.algo_id, p.tile,
                              p.stages, p.probe_m);
  if (p.slices > 1) d += fmt::format(", K in {} slices of {}", p.slices, p.klen);
  for (const auto& a : p.alts) {
    const std::string range =
        fmt::format("M {}..{}", a.lo, a.hi == INT64_MAX ? std::string("") : std::to_string(a.hi));
    d += a.own      ? fmt::format("; {}: own gemv kernel ({})", range, a.status)
         : a.usable ? fmt::format("; {}: algo {} tile {} stages {} ({})", range, a.algo_id, a.tile,
                                  a.stages, a.status)
                    : fmt::format("; {}: plan algorithm ({})", range, a.status);
  }
  return d;
}

}  // namespace qtk::cuda
