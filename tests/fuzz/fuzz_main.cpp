// libFuzzer driver: compiled once per target with -DQTK_FUZZ_ENTRY=<entry>.
#include "tests/fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return qtk::fuzz::QTK_FUZZ_ENTRY(data, size);
}
