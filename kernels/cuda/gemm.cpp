#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "loaders/error.h"

namespace qtk::cuda {
namespace {

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

}  // namespace

// Column-major view of the row-major product: C[N, M] = op(A) B with
// A = w as col-major [K, N] (ld ldw), op = transpose; B = x as col-major
// [K, M] (ld ldx); C = y as col-major [N, M] (ld ldy).
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;
  cudaDataType_t in_t{}, out_t{};
  int64_t k = 0, ldx = 0, ldy = 0, n = 0;
  cublasLtMatmulAlgo_t algo{};
  int algo_id = -1, tile = -1, stages = -1;
  int64_t probe_m = 0;  // the M whose heuristic offered the algorithm
  bool ok = true;       // false: no algorithm qualified (why says what was rejected)
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
  const std::pair<cublasLtMatrixLayout_t, cublasLtMatrixLayout_t>& layouts(int64_t m) {
    auto it = bc.find(m);
    if (it == bc.end())
      it =
          bc.emplace(m, std::make_pair(make_layout(in_t, k, m, ldx), make_layout(out_t, n, m, ldy)))
              .first;
    return it->second;
  }
};

namespace {
int64_t default_ref_m() {
  const char* v = std::getenv("QTK_GEMM_REF_M");
  if (v == nullptr || *v == '\0') return 128;
  char* end = nullptr;
  const long long m = std::strtoll(v, &end, 10);
  if (*end != '\0' || m < 1 || m > 65536)
    fail("QTK_GEMM_REF_M: expected an integer in 1..65536, found \"{}\"", v);
  return m;
}
}  // namespace

Gemm::Gemm(int64_t ref_m) : ref_m_(ref_m > 0 ? ref_m : default_ref_m()) {
  cublasLtHandle_t h = nullptr;
  QTK_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
}

Gemm::~Gemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

Gemm::Plan& Gemm::plan(int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldy, DType in,
                       DType out) {
  const Key key{n, k, ldx, ldw, ldy, static_cast<int>(in), static_cast<int>(out)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  if (in == DType::F32 && out != DType::F32)
    fail("Gemm: F32 inputs need an F32 output, got {}", dtype_name(out));
  auto p = std::make_unique<Plan>();
  auto lt = static_cast<cublasLtHandle_t>(handle_);
  p->in_t = cuda_type(in);
  p->out_t = cuda_type(out);
  p->k = k;
  p->n = n;
  p->ldx = ldx;
  p->ldy = ldy;
  QTK_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  QTK_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  QTK_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  p->a = make_layout(p->in_t, k, n, ldw);

  cublasLtMatmulPreference_t pref = nullptr;
  QTK_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t no_workspace = 0;
  QTK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &no_workspace, sizeof(no_workspace)));
  // note: views into activation buffers are only guaranteed 16-byte aligned.
  const uint32_t align = 16;
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    QTK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));

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
      const int32_t splitk = 1;
      const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
      // Algorithms without a split-K knob accept neither attribute; they
      // never split K, so a failed set is fine as long as the check passes.
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                           sizeof(splitk));
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                           sizeof(scheme));
      int32_t got_splitk = 1;
      size_t written = 0;
      if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &got_splitk,
                                               sizeof(got_splitk),
                                               &written) == CUBLAS_STATUS_SUCCESS &&
          got_splitk > 1) {
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
    return *plans_.emplace(key, std::move(p)).first->second;
  }
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &p->algo_id,
                                       sizeof(p->algo_id), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &p->tile,
                                       sizeof(p->tile), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &p->stages,
                                       sizeof(p->stages), &written);
  return *plans_.emplace(key, std::move(p)).first->second;
}

void Gemm::run(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy,
               int64_t m, int64_t n, int64_t k, DType in, DType out, cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  for (const void* ptr : {x, w, static_cast<const void*>(y)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      fail("Gemm: pointer {} is not 16-byte aligned", ptr);
  Plan& p = plan(n, k, ldx, ldw, ldy, in, out);
  if (!p.ok) {
    // note: some very wide products (a 151936-row lm_head) get no
    // qualifying algorithm; they run as column blocks of kChunkN output
    // columns. Each output element is still one K reduction by one fixed
    // algorithm, and the split depends on N only, so invariance holds.
    constexpr int64_t kChunkN = 16384;
    if (n <= kChunkN) fail("{}", p.why);
    const int64_t wes = dtype_size(in), yes = dtype_size(out);
    for (int64_t off = 0; off < n; off += kChunkN)
      run(x, ldx, static_cast<const char*>(w) + off * ldw * wes, ldw,
          static_cast<char*>(y) + off * yes, ldy, m, std::min(kChunkN, n - off), k, in, out,
          stream);
    return;
  }
  const auto& l = p.layouts(m);
  const float alpha = 1.0f, beta = 0.0f;
  QTK_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.desc, &alpha, w, p.a, x,
                                  l.first, &beta, y, l.second, y, l.second, &p.algo, nullptr, 0,
                                  stream));
}

std::string Gemm::describe(int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldy, DType in,
                           DType out) {
  const Plan& p = plan(n, k, ldx, ldw, ldy, in, out);
  if (!p.ok) return fmt::format("column blocks of 16384 ({})", p.why.substr(0, 120));
  return fmt::format("algo {} tile {} stages {} (heuristic of M {})", p.algo_id, p.tile, p.stages,
                     p.probe_m);
}

}  // namespace qtk::cuda
