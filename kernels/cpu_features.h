// Run-time CPU feature detection and the choice of SIMD code path.
#pragma once

#include <string>
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
// kAmx runs matmul with bf16 weights on AMX tiles (bf16x3-split activations,
// kernels/cpu/matmul_amx.cpp) and everything else as kAvx512 does.
enum class CpuPath { kScalar, kAvx2, kAvx512, kAmx };

// Every path, portable first (the order supported_cpu_paths() keeps).
inline constexpr CpuPath kAllCpuPaths[] = {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512,
                                           CpuPath::kAmx};

std::string_view cpu_path_name(CpuPath path);
bool cpu_path_supported(CpuPath path);
// What this CPU (or OS) lacks for the path, e.g. "amx_tile, amx_bf16";
// empty when the path is supported.
std::string cpu_path_missing(CpuPath path);
// Every path this machine can run, portable first.
std::vector<CpuPath> supported_cpu_paths();
// The best supported path, or the one forced by
// QTK_CPU_PATH=scalar|avx2|avx512|amx (read once). Throws qtk::Error when the variable names an
// unknown path or one this CPU cannot run.
CpuPath active_cpu_path();

}  // namespace qtk
