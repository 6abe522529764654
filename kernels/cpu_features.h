// Run-time CPU feature detection and the choice of SIMD code path.
#pragma once

#include <string_view>
#include <vector>

namespace qtk {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_bf16 = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_permitted = false;  // the OS granted XTILEDATA (arch_prctl)
  bool os_avx = false;         // XCR0 enables YMM state
  bool os_avx512 = false;      // XCR0 enables opmask and ZMM state
};

// Detected once (CPUID + XGETBV; for AMX also arch_prctl(ARCH_REQ_XCOMP_PERM)).
const CpuFeatures& cpu_features();

// note: each path fixes its own reduction order, so two paths may differ in
// the last bits; within one path results never depend on batch or threads.
enum class CpuPath { kScalar, kAvx2, kAvx512 };

std::string_view cpu_path_name(CpuPath path);
bool cpu_path_supported(CpuPath path);
// Every path this machine can run, portable first.
std::vector<CpuPath> supported_cpu_paths();
// The best supported path, or the one forced by QTK_CPU_PATH=scalar|avx2|avx512
// (read once). Throws qtk::Error when the variable names an unknown path or
// one this CPU cannot run.
CpuPath active_cpu_path();

}  // namespace qtk
