#include "core/tuning.h"

#include <charconv>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "core/error.h"

namespace qtk {

const char* const kTuningCpuPaths[4] = {"scalar", "avx2", "avx512", "amx"};

namespace {

// The text of a switch, or nullopt when it is unset or empty (its default).
std::optional<std::string_view> text_of(const std::function<const char*(const char*)>& getenv,
                                        const char* name) {
  const char* v = getenv ? getenv(name) : std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string_view(v);
}

bool parse_bool(const char* name, std::string_view v) {
  if (v == "0") return false;
  if (v == "1") return true;
  fail("{}: expected 0 or 1, found '{}'", name, v);
}

// A whole decimal integer, or nullopt (no sign '+', no spaces, no overflow).
std::optional<int64_t> to_int(std::string_view v) {
  int64_t x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size()) return std::nullopt;
  return x;
}

int64_t parse_int(const char* name, std::string_view v, int64_t min, int64_t max) {
  const std::optional<int64_t> x = to_int(v);
  if (!x || *x < min || *x > max)
    fail("{}: expected an integer {}..{}, found '{}'", name, min, max, v);
  return *x;
}

void check_range(const char* name, int64_t x, int64_t min, int64_t max) {
  if (x < min || x > max) fail("{}: expected an integer {}..{}, found '{}'", name, min, max, x);
}

void check_cpu_path(std::string_view v) {
  if (v.empty()) return;
  for (const char* p : kTuningCpuPaths)
    if (v == p) return;
  fail("QTK_CPU_PATH: expected scalar, avx2, avx512 or amx, found '{}'", v);
}

bool state_columns_ok(int64_t x) { return x == 0 || x == 16 || x == 32; }

template <typename Text>
[[noreturn]] void bad_state_columns(const Text& found) {
  fail("QTK_GDN_STATE_COLUMNS: expected 16, 32 or 0 (chosen per batch), found '{}'", found);
}

bool gemm_slices_ok(int64_t x) { return x == 1 || x == 4; }

template <typename Text>
[[noreturn]] void bad_gemm_slices(const Text& found) {
  fail("QTK_GEMM_SLICES: expected 1 (one chain over K) or 4 (four K slices), found '{}'", found);
}

bool mma_wide_ok(int64_t x) { return x == 0 || x == 4 || x == 32 || x == 64 || x == 90; }

template <typename Text>
[[noreturn]] void bad_mma_wide(const Text& found) {
  fail(
      "QTK_MMA_WIDE: expected 0 (chosen per shape), 4 (the 4-warp kernel), 32 or 64 (rows "
      "per pass of the split kernel), 90 (the sm_90 warpgroup kernel), found '{}'",
      found);
}

}  // namespace

Tuning Tuning::from_environment(const std::function<const char*(const char*)>& getenv) {
  Tuning t;
  auto flag = [&](const char* name, bool& field) {
    if (auto v = text_of(getenv, name)) field = parse_bool(name, *v);
  };
  auto number = [&](const char* name, auto& field, int64_t min, int64_t max) {
    if (auto v = text_of(getenv, name))
      field = static_cast<std::remove_reference_t<decltype(field)>>(parse_int(name, *v, min, max));
  };
  if (auto v = text_of(getenv, "QTK_CPU_PATH")) {
    check_cpu_path(*v);
    t.cpu_path = std::string(*v);
  }
  number("QTK_AMX_PREFETCH", t.amx_prefetch, 0, kAmxPrefetchModes - 1);
  flag("QTK_TILED", t.tiled);
  flag("QTK_HUGEPAGES", t.hugepages);
  flag("QTK_GEMM_ALTS", t.gemm_alternates);
  flag("QTK_GEMM_FREE", t.gemm_free);
  number("QTK_GEMM_REF_M", t.gemm_ref_m, 1, kGemmRefMMax);
  number("QTK_FUSED_MAX_M", t.fused_max_m, 0, kFusedMaxMMax);
  if (auto v = text_of(getenv, "QTK_GEMM_SLICES")) {
    const std::optional<int64_t> x = to_int(*v);
    if (!x || !gemm_slices_ok(*x)) bad_gemm_slices(*v);
    t.gemm_slices = static_cast<int>(*x);
  }
  flag("QTK_MMA_MATMUL", t.mma_matmul);
  if (auto v = text_of(getenv, "QTK_MMA_WIDE")) {
    const std::optional<int64_t> x = to_int(*v);
    if (!x || !mma_wide_ok(*x)) bad_mma_wide(*v);
    t.mma_wide = static_cast<int>(*x);
  }
  flag("QTK_GDN_CHUNKED", t.gdn_chunked);
  if (auto v = text_of(getenv, "QTK_GDN_STATE_COLUMNS")) {
    const std::optional<int64_t> x = to_int(*v);
    if (!x || !state_columns_ok(*x)) bad_state_columns(*v);
    t.gdn_state_columns = static_cast<int>(*x);
  }
  flag("QTK_PDL", t.pdl);
  flag("QTK_CUDA_GRAPHS", t.cuda_graphs);
  flag("QTK_PIPELINE", t.pipeline);
  number("QTK_MEM_AVAILABLE", t.mem_available, 0, std::numeric_limits<int64_t>::max());
  if (auto v = text_of(getenv, "QTK_PLAN_CACHE")) t.plan_cache = std::string(*v);
  return t;
}

void Tuning::validate() const {
  check_cpu_path(cpu_path);
  check_range("QTK_AMX_PREFETCH", amx_prefetch, 0, kAmxPrefetchModes - 1);
  check_range("QTK_GEMM_REF_M", gemm_ref_m, 1, kGemmRefMMax);
  check_range("QTK_FUSED_MAX_M", fused_max_m, 0, kFusedMaxMMax);
  if (!state_columns_ok(gdn_state_columns)) bad_state_columns(gdn_state_columns);
  if (!mma_wide_ok(mma_wide)) bad_mma_wide(mma_wide);
  if (!gemm_slices_ok(gemm_slices)) bad_gemm_slices(gemm_slices);
  check_range("QTK_MEM_AVAILABLE", mem_available, 0, std::numeric_limits<int64_t>::max());
}

std::vector<TuningEntry> Tuning::entries() const {
  auto b = [](bool v) { return int64_t{v ? 1 : 0}; };
  using E = TuningEffect;
  // note: which switches can change a token or a margin (--resume refuses a
  // change of these only, on the device they act on):
  //  - QTK_CPU_PATH: each SIMD path has its own reduction order (README,
  //    Determinism), so the bits differ between paths.
  //  - QTK_GEMM_REF_M picks the plan algorithm, the one that fixes the bits.
  //  - QTK_GEMM_ALTS and QTK_FUSED_MAX_M pick which kernel computes a
  //    product; their bit-equality with the plan algorithm is checked on
  //    the real weights with sample inputs, not given by construction, so
  //    they count as result-changing (conservative).
  //  - QTK_GEMM_SLICES: one chain over K or four slices summed in order.
  //  - QTK_GEMM_FREE: an algorithm per call (not even batch invariant).
  //  - QTK_MMA_MATMUL: the tensor-core and the warp product sum in
  //    different orders.
  //  - QTK_GDN_CHUNKED: the chunked and the recurrent gated delta rule sum
  //    in different orders.
  //  - QTK_AMX_PREFETCH (prefetch hints), QTK_TILED (the same products on a
  //    copied layout, tests/tiled), QTK_HUGEPAGES (where the pages live),
  //    QTK_GDN_STATE_COLUMNS (how state columns are spread over blocks, the
  //    same arithmetic per column), QTK_MMA_WIDE (which threads compute a
  //    range sum, the same sums), QTK_PDL (launch overlap), QTK_CUDA_GRAPHS
  //    (the same kernels replayed), QTK_PIPELINE (when the host builds a
  //    step; the rows do not depend on the batch), QTK_MEM_AVAILABLE (the
  //    KV cache's size: when sequences are preempted) and QTK_PLAN_CACHE (a
  //    cached plan is used only where it gives the plan algorithm's bits)
  //    change speed only.
  return {
      {"QTK_CPU_PATH", cpu_path, E::kCpuResults},
      {"QTK_AMX_PREFETCH", int64_t{amx_prefetch}, E::kNone},
      {"QTK_TILED", b(tiled), E::kNone},
      {"QTK_HUGEPAGES", b(hugepages), E::kNone},
      {"QTK_GEMM_ALTS", b(gemm_alternates), E::kCudaResults},
      {"QTK_GEMM_REF_M", gemm_ref_m, E::kCudaResults},
      {"QTK_FUSED_MAX_M", fused_max_m, E::kCudaResults},
      {"QTK_GEMM_SLICES", int64_t{gemm_slices}, E::kCudaResults},
      {"QTK_GEMM_FREE", b(gemm_free), E::kCudaResults},
      {"QTK_MMA_MATMUL", b(mma_matmul), E::kCudaResults},
      {"QTK_MMA_WIDE", int64_t{mma_wide}, E::kNone},
      {"QTK_GDN_CHUNKED", b(gdn_chunked), E::kCudaResults},
      {"QTK_GDN_STATE_COLUMNS", int64_t{gdn_state_columns}, E::kNone},
      {"QTK_PDL", b(pdl), E::kNone},
      {"QTK_CUDA_GRAPHS", b(cuda_graphs), E::kNone},
      {"QTK_PIPELINE", b(pipeline), E::kNone},
      {"QTK_MEM_AVAILABLE", mem_available, E::kNone},
      {"QTK_PLAN_CACHE", plan_cache, E::kNone},
  };
}

std::string tuning_help() {
  return R"(Tuning switches (environment; unset or empty = default; README.md, "Tuning switches"):
  switch                 values                        default  can change tokens/margins
  QTK_CPU_PATH           scalar|avx2|avx512|amx        best     yes (cpu)
  QTK_AMX_PREFETCH       0..4                          1        no
  QTK_TILED              0|1                           1        no
  QTK_HUGEPAGES          0|1                           1        no
  QTK_GEMM_ALTS          0|1                           1        yes (cuda)
  QTK_GEMM_REF_M         1..65536                      128      yes (cuda)
  QTK_FUSED_MAX_M        0..16                         1        yes (cuda)
  QTK_GEMM_SLICES        1|4                           4        yes (cuda)
  QTK_GEMM_FREE          0|1 (1: not batch invariant)  0        yes (cuda)
  QTK_MMA_MATMUL         0|1                           1        yes (cuda)
  QTK_MMA_WIDE           0 (per shape)|4|32|64|90      0        no
  QTK_GDN_CHUNKED        0|1                           1        yes (cuda)
  QTK_GDN_STATE_COLUMNS  0 (per batch)|16|32           0        no
  QTK_PDL                0|1                           1        no
  QTK_CUDA_GRAPHS        0|1                           1        no
  QTK_PIPELINE           0|1                           1        no
  QTK_MEM_AVAILABLE      bytes (0: the system's)       0        no
  QTK_PLAN_CACHE         FILE|off                      (*)      no
  (*) --plan-cache's default; unset: a file per GPU and model under the cache directory.
QTK_MEM_AVAILABLE is the memory the CPU run's default KV cache fits into (half of it
at most, never less than the longest request needs).
Every switch is written to the run header ("tuning"); --resume refuses a changed
switch that can change tokens or margins on the run's device.
)";
}

namespace {

struct TuningSlot {
  std::mutex mu;
  std::optional<Tuning> value;
};

TuningSlot& slot() {
  static TuningSlot s;
  return s;
}

}  // namespace

const Tuning& tuning() {
  TuningSlot& s = slot();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.value) s.value = Tuning::from_environment();
  return *s.value;
}

void set_tuning(const Tuning& t) {
  t.validate();
  TuningSlot& s = slot();
  std::lock_guard<std::mutex> lock(s.mu);
  s.value = t;
}

}  // namespace qtk
