// generate's --device and --precision flags on any machine: bad combinations
// fail up front (exit 1, one stderr line naming the flag, no output files),
// the run header records device and precision, and --resume refuses a run
// made with another precision. The GPU runs themselves are in tests/cuda.
#include <filesystem>

#include "tests/runtime/test_util.h"

namespace qtk::rt_test {
namespace {

const char* kTiny = "tests/data/models/qwen3-tiny";

std::string small_batch() {
  const std::string in = work_dir() + "/device.jsonl";
  write_text(in,
             "{\"id\": \"a\", \"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 3}\n"
             "{\"id\": \"b\", \"prompt_token_ids\": [7, 8], \"max_tokens\": 2}\n");
  return in;
}

// A fatal flag error: exit 1, one line on stderr holding `needle`, no files.
void expect_refused(const std::string& flags, const std::string& tag, const std::string& needle) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string out = fmt::format("{}/device.{}.jsonl", work_dir(), tag);
  RunResult r = generate(pack, small_batch(), out, flags);
  EXPECT_EQ(r.status, 1) << flags << ": " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("generate: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out)) << flags;
  EXPECT_FALSE(std::filesystem::exists(out + ".meta.json")) << flags;
}

TEST(DeviceFlags, CpuRefusesBf16) {
  expect_refused("--precision bf16", "cpu_bf16",
                 "--precision bf16: the cpu device computes in float32 only");
}

TEST(DeviceFlags, UnknownPrecisionAndDevice) {
  expect_refused("--precision f16", "f16", "--precision: expected f32 or bf16, found \"f16\"");
  expect_refused("--device tpu", "tpu", "--device: expected cpu or cuda, found \"tpu\"");
  expect_refused("--device cuda --precision fp8", "cuda_fp8", "--precision");
}

// --tune-only tunes the CUDA GEMM plans (runtime/backend/cuda/cuda_startup.h).
TEST(DeviceFlags, TuneOnlyNeedsCuda) {
  expect_refused("--tune-only", "tune_cpu",
                 "--tune-only: tunes the CUDA GEMM plans; expected --device cuda, found "
                 "--device cpu");
}

#ifndef QTK_TEST_HAVE_CUDA
TEST(DeviceFlags, CudaWithoutCudaBuild) {
  expect_refused("--device cuda", "cuda", "--device cuda: this build has no CUDA backend");
}
#endif

TEST(DeviceFlags, RunHeaderRecordsDeviceAndPrecision) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = small_batch();
  const std::string dflt = work_dir() + "/device.default.jsonl";
  const std::string f32 = work_dir() + "/device.f32.jsonl";
  ASSERT_EQ(generate(pack, in, dflt, "--margins").status, 0);
  RunResult r = generate(pack, in, f32, "--margins --device cpu --precision f32");
  ASSERT_EQ(r.status, 0) << r.err;
  // f32 is the CPU's default: the same results, byte for byte.
  EXPECT_EQ(read_text(f32), read_text(dflt));
  const auto meta = load_json(f32 + ".meta.json");
  EXPECT_EQ(meta["settings"]["device"], "cpu") << meta.dump(2);
  EXPECT_EQ(meta["settings"]["precision"], "f32") << meta.dump(2);
  EXPECT_EQ(meta["device"], "cpu") << meta.dump(2);
  EXPECT_EQ(load_json(dflt + ".meta.json")["settings"]["precision"], "f32");

  // A header that says another precision: --resume refuses, naming it.
  auto edited = meta;
  edited["settings"]["precision"] = "bf16";
  write_text(f32 + ".meta.json", edited.dump(2));
  const std::string before = read_text(f32);
  RunResult bad = generate(pack, in, f32, "--margins --resume");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("setting 'precision' was \"bf16\", now \"f32\""), std::string::npos)
      << bad.err;
  EXPECT_EQ(read_text(f32), before);
}

}  // namespace
}  // namespace qtk::rt_test
