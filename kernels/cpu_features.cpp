#include "kernels/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/tuning.h"

namespace qtk {

namespace {

uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

// note: Linux keeps AMX tile data disabled until a process asks for it.
bool request_amx_permission() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  bool osxsave = (ecx >> 27) & 1;
  f.fma = (ecx >> 12) & 1;
  f.f16c = (ecx >> 29) & 1;
  uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  f.os_avx = (xcr0 & 0x6) == 0x6;
  f.os_avx512 = f.os_avx && (xcr0 & 0xE0) == 0xE0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  f.avx2 = f.os_avx && ((ebx >> 5) & 1);
  f.avx512f = f.os_avx512 && ((ebx >> 16) & 1);
  f.avx512bw = f.os_avx512 && ((ebx >> 30) & 1);
  f.avx512vl = f.os_avx512 && ((ebx >> 31) & 1);
  f.amx_bf16 = (edx >> 22) & 1;
  f.amx_tile = (edx >> 24) & 1;
  unsigned sub_eax, sub_ebx, sub_ecx, sub_edx;
  __cpuid_count(7, 1, sub_eax, sub_ebx, sub_ecx, sub_edx);
  f.avx512_bf16 = f.os_avx512 && ((sub_eax >> 5) & 1);
  f.fma = f.fma && f.os_avx;
  f.f16c = f.f16c && f.os_avx;
  if (f.amx_tile) f.amx_permitted = request_amx_permission();
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string_view cpu_path_name(CpuPath path) {
  switch (path) {
    case CpuPath::kScalar:
      return "scalar";
    case CpuPath::kAvx2:
      return "avx2";
    case CpuPath::kAvx512:
      return "avx512";
    case CpuPath::kAmx:
      return "amx";
  }
  return "?";
}

bool cpu_path_supported(CpuPath path) { return cpu_path_missing(path).empty(); }

std::string cpu_path_missing(CpuPath path) {
  const CpuFeatures& f = cpu_features();
  std::string missing;
  auto need = [&](bool have, const char* name) {
    if (have) return;
    if (!missing.empty()) missing += ", ";
    missing += name;
  };
  switch (path) {
    case CpuPath::kScalar:
      break;
    case CpuPath::kAvx2:
      need(f.avx2, "avx2");
      need(f.fma, "fma");
      need(f.f16c, "f16c");
      break;
    case CpuPath::kAmx:
      need(f.amx_tile, "amx_tile");
      need(f.amx_bf16, "amx_bf16");
      if (f.amx_tile) need(f.amx_permitted, "XTILEDATA permission (arch_prctl refused)");
      [[fallthrough]];
    case CpuPath::kAvx512:
      need(f.avx512f, "avx512f");
      need(f.avx512bw, "avx512bw");
      need(f.avx512vl, "avx512vl");
      need(f.fma, "fma");
      need(f.f16c, "f16c");
      break;
  }
  return missing;
}

std::vector<CpuPath> supported_cpu_paths() {
  std::vector<CpuPath> paths;
  for (CpuPath p : kAllCpuPaths) {
    if (cpu_path_supported(p)) paths.push_back(p);
  }
  return paths;
}

namespace {

CpuPath choose_path() {
  const std::string& want = tuning().cpu_path;
  if (want.empty()) return supported_cpu_paths().back();
  for (CpuPath p : kAllCpuPaths) {
    if (want == cpu_path_name(p)) {
      if (!cpu_path_supported(p)) {
        fail(
            "QTK_CPU_PATH: this CPU cannot run path '{}' (missing: {}); "
            "unset it or use one of the supported paths",
            want, cpu_path_missing(p));
      }
      return p;
    }
  }
  fail("QTK_CPU_PATH: expected scalar, avx2, avx512 or amx, found '{}'", want);
}

}  // namespace

CpuPath active_cpu_path() {
  static const CpuPath path = choose_path();
  return path;
}

}  // namespace qtk
