// Runs a test command on one CPU path, or reports the path as skipped.
//   path_gate PATH COMMAND [ARGS...]
// Sets QTK_CPU_PATH=PATH and replaces itself with COMMAND when this CPU can
// run PATH; otherwise prints one line naming what the machine lacks and exits
// with 77, which ctest reports as "Skipped" (SKIP_RETURN_CODE), not passed.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cpu_features.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "path_gate: usage: path_gate PATH COMMAND [ARGS...]\n");
    return 2;
  }
  const std::string want = argv[1];
  for (qtk::CpuPath p : qtk::kAllCpuPaths) {
    if (want != qtk::cpu_path_name(p)) continue;
    if (!qtk::cpu_path_supported(p)) {
      std::printf("SKIPPED: CPU path %s not run: this machine lacks %s\n", want.c_str(),
                  qtk::cpu_path_missing(p).c_str());
      return 77;
    }
    setenv("QTK_CPU_PATH", want.c_str(), 1);
    execv(argv[2], argv + 2);
    std::fprintf(stderr, "path_gate: cannot run %s: %s\n", argv[2], std::strerror(errno));
    return 127;
  }
  std::fprintf(stderr, "path_gate: CPU path: expected scalar, avx2, avx512 or amx, found '%s'\n",
               want.c_str());
  return 2;
}
