// The QTK_* tuning switches (core/tuning.h): parsing and validation of each
// one, the run header's "tuning" record, and --resume's refusal of a changed
// switch that can change tokens or margins.
#include <filesystem>
#include <map>
#include <optional>
#include <tuple>

#include "core/error.h"
#include "core/tuning.h"
#include "kernels/cpu_features.h"
#include "runtime/generate_resume.h"
#include "tests/runtime/test_util.h"

namespace qtk::rt_test {
namespace {

using Env = std::map<std::string, std::string>;

Tuning parse(const Env& env) {
  return Tuning::from_environment([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// The message of the qtk::Error `f` throws, or "" when it throws none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string parse_error(const std::string& name, const std::string& value) {
  return error_of([&] { parse({{name, value}}); });
}

TEST(Tuning, UnsetOrEmptyGivesTheDefaults) {
  const Tuning d;
  EXPECT_EQ(d.cpu_path, "");
  EXPECT_EQ(d.amx_prefetch, 1);
  EXPECT_TRUE(d.tiled && d.hugepages && d.gemm_alternates && d.gdn_chunked && d.pdl &&
              d.cuda_graphs && d.pipeline);
  EXPECT_EQ(d.gemm_ref_m, 128);
  EXPECT_EQ(d.fused_max_m, 1);
  EXPECT_EQ(d.gdn_state_columns, 0);
  EXPECT_EQ(d.plan_cache, "");
  Env empty;
  for (const TuningEntry& e : d.entries()) empty[e.name] = "";
  EXPECT_EQ(tuning_header(parse({})), tuning_header(d));
  EXPECT_EQ(tuning_header(parse(empty)), tuning_header(d));
}

TEST(Tuning, ReadsEverySwitch) {
  const Tuning t = parse({{"QTK_CPU_PATH", "avx2"},
                          {"QTK_AMX_PREFETCH", "4"},
                          {"QTK_TILED", "0"},
                          {"QTK_HUGEPAGES", "0"},
                          {"QTK_GEMM_ALTS", "0"},
                          {"QTK_GEMM_REF_M", "65536"},
                          {"QTK_FUSED_MAX_M", "0"},
                          {"QTK_GEMM_SLICES", "1"},
                          {"QTK_GEMM_FREE", "1"},
                          {"QTK_MMA_MATMUL", "0"},
                          {"QTK_MMA_WIDE", "32"},
                          {"QTK_GDN_CHUNKED", "0"},
                          {"QTK_GDN_STATE_COLUMNS", "32"},
                          {"QTK_PDL", "0"},
                          {"QTK_CUDA_GRAPHS", "0"},
                          {"QTK_PIPELINE", "0"},
                          {"QTK_MEM_AVAILABLE", "1048576"},
                          {"QTK_PLAN_CACHE", "off"}});
  EXPECT_EQ(t.cpu_path, "avx2");
  EXPECT_EQ(t.amx_prefetch, 4);
  EXPECT_FALSE(t.tiled || t.hugepages || t.gemm_alternates || t.mma_matmul || t.gdn_chunked ||
               t.pdl || t.cuda_graphs || t.pipeline);
  EXPECT_EQ(t.gemm_ref_m, 65536);
  EXPECT_EQ(t.mem_available, 1048576);
  EXPECT_EQ(parse({}).mem_available, 0);
  EXPECT_EQ(t.fused_max_m, 0);
  EXPECT_EQ(t.gemm_slices, 1);
  EXPECT_TRUE(t.gemm_free);
  EXPECT_FALSE(parse({}).gemm_free);
  EXPECT_EQ(parse({}).gemm_slices, 4);
  EXPECT_EQ(parse({{"QTK_GEMM_SLICES", "4"}}).gemm_slices, 4);
  EXPECT_EQ(t.gdn_state_columns, 32);
  EXPECT_EQ(t.mma_wide, 32);
  EXPECT_EQ(t.plan_cache, "off");
  EXPECT_EQ(parse({{"QTK_FUSED_MAX_M", "16"}}).fused_max_m, 16);
  EXPECT_EQ(parse({{"QTK_GEMM_REF_M", "1"}}).gemm_ref_m, 1);
  EXPECT_EQ(parse({{"QTK_GDN_STATE_COLUMNS", "16"}}).gdn_state_columns, 16);
  EXPECT_EQ(parse({{"QTK_MMA_WIDE", "4"}}).mma_wide, 4);
  EXPECT_EQ(parse({{"QTK_MMA_WIDE", "64"}}).mma_wide, 64);
  EXPECT_EQ(parse({{"QTK_MMA_WIDE", "90"}}).mma_wide, 90);
  EXPECT_EQ(parse({}).mma_wide, 0);
  EXPECT_TRUE(parse({{"QTK_PDL", "1"}}).pdl);
}

TEST(Tuning, AcceptsEveryCpuPathName) {
  for (CpuPath p : kAllCpuPaths) {
    const std::string name(cpu_path_name(p));
    EXPECT_EQ(parse({{"QTK_CPU_PATH", name}}).cpu_path, name);
  }
}

TEST(Tuning, BadValuesNameTheSwitchAndTheValue) {
  const std::pair<std::string, std::string> cases[] = {
      {"QTK_FUSED_MAX_M", "QTK_FUSED_MAX_M: expected an integer 0..16, found 'abc'"},
      {"QTK_GEMM_REF_M", "QTK_GEMM_REF_M: expected an integer 1..65536, found 'abc'"},
      {"QTK_AMX_PREFETCH", "QTK_AMX_PREFETCH: expected an integer 0..4, found 'abc'"},
      {"QTK_GDN_STATE_COLUMNS",
       "QTK_GDN_STATE_COLUMNS: expected 16, 32 or 0 (chosen per batch), found 'abc'"},
      {"QTK_CPU_PATH", "QTK_CPU_PATH: expected scalar, avx2, avx512 or amx, found 'abc'"},
      {"QTK_MMA_WIDE",
       "QTK_MMA_WIDE: expected 0 (chosen per shape), 4 (the 4-warp kernel), 32 or 64 (rows "
       "per pass of the split kernel), 90 (the sm_90 warpgroup kernel), found 'abc'"},
      {"QTK_GEMM_SLICES",
       "QTK_GEMM_SLICES: expected 1 (one chain over K) or 4 (four K slices), found 'abc'"},
      {"QTK_TILED", "QTK_TILED: expected 0 or 1, found 'abc'"},
      {"QTK_HUGEPAGES", "QTK_HUGEPAGES: expected 0 or 1, found 'abc'"},
      {"QTK_GEMM_ALTS", "QTK_GEMM_ALTS: expected 0 or 1, found 'abc'"},
      {"QTK_MMA_MATMUL", "QTK_MMA_MATMUL: expected 0 or 1, found 'abc'"},
      {"QTK_GDN_CHUNKED", "QTK_GDN_CHUNKED: expected 0 or 1, found 'abc'"},
      {"QTK_PDL", "QTK_PDL: expected 0 or 1, found 'abc'"},
      {"QTK_CUDA_GRAPHS", "QTK_CUDA_GRAPHS: expected 0 or 1, found 'abc'"},
      {"QTK_PIPELINE", "QTK_PIPELINE: expected 0 or 1, found 'abc'"},
      {"QTK_GEMM_FREE", "QTK_GEMM_FREE: expected 0 or 1, found 'abc'"},
  };
  for (const auto& [name, message] : cases) EXPECT_EQ(parse_error(name, "abc"), message);
}

TEST(Tuning, OutOfRangeAndMalformedNumbersAreRefused) {
  for (const char* v : {"17", "-1", "1.5", " 1", "+1", "1 ", "99999999999999999999"})
    EXPECT_NE(parse_error("QTK_FUSED_MAX_M", v), "") << v;
  for (const char* v : {"0", "65537"}) EXPECT_NE(parse_error("QTK_GEMM_REF_M", v), "") << v;
  for (const char* v : {"-1", "2G", "1e9", "99999999999999999999"})
    EXPECT_NE(parse_error("QTK_MEM_AVAILABLE", v), "") << v;
  EXPECT_EQ(parse_error("QTK_MEM_AVAILABLE", "9223372036854775807"), "");
  EXPECT_EQ(parse_error("QTK_AMX_PREFETCH", "5"),
            "QTK_AMX_PREFETCH: expected an integer 0..4, found '5'");
  for (const char* v : {"8", "64", "1"}) EXPECT_NE(parse_error("QTK_GDN_STATE_COLUMNS", v), "");
  for (const char* v : {"16", "128", "1", "-1", "9"})
    EXPECT_NE(parse_error("QTK_MMA_WIDE", v), "") << v;
  for (const char* v : {"0", "2", "3", "8", "-4"})
    EXPECT_NE(parse_error("QTK_GEMM_SLICES", v), "") << v;
  for (const char* v : {"yes", "true", "2", "00"}) EXPECT_NE(parse_error("QTK_PDL", v), "") << v;
  EXPECT_EQ(parse_error("QTK_CPU_PATH", "AVX2"),
            "QTK_CPU_PATH: expected scalar, avx2, avx512 or amx, found 'AVX2'");
}

// generate --help's table lists, for each switch with a fixed set of values,
// exactly the values its validator accepts (each accepted here, and the
// neighbours of a range refused).
TEST(Tuning, HelpListsExactlyTheValuesEachValidatorAccepts) {
  const std::string help = tuning_help();
  // The "values" column of a switch's row: its entries split at '|', each
  // up to its first space ("0 (per shape)" -> "0").
  auto values_of = [&](const std::string& name) {
    const size_t at = help.find("\n  " + name + " ");
    EXPECT_NE(at, std::string::npos) << name;
    if (at == std::string::npos) return std::vector<std::string>{};
    const std::string row = help.substr(at + 1, help.find('\n', at + 1) - at - 1);
    std::string column = row.substr(25, 30);
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos <= column.size()) {
      const size_t bar = column.find('|', pos);
      std::string v = column.substr(pos, bar == std::string::npos ? std::string::npos : bar - pos);
      v = v.substr(0, v.find(' '));
      out.push_back(v);
      if (bar == std::string::npos) break;
      pos = bar + 1;
    }
    return out;
  };
  const std::pair<std::string, std::vector<std::string>> sets[] = {
      {"QTK_CPU_PATH", {"scalar", "avx2", "avx512", "amx"}},
      {"QTK_MMA_WIDE", {"0", "4", "32", "64", "90"}},
      {"QTK_GDN_STATE_COLUMNS", {"0", "16", "32"}},
      {"QTK_GEMM_SLICES", {"1", "4"}},
      {"QTK_TILED", {"0", "1"}},
      {"QTK_HUGEPAGES", {"0", "1"}},
      {"QTK_GEMM_ALTS", {"0", "1"}},
      {"QTK_GEMM_FREE", {"0", "1"}},
      {"QTK_MMA_MATMUL", {"0", "1"}},
      {"QTK_GDN_CHUNKED", {"0", "1"}},
      {"QTK_PDL", {"0", "1"}},
      {"QTK_CUDA_GRAPHS", {"0", "1"}},
      {"QTK_PIPELINE", {"0", "1"}},
  };
  for (const auto& [name, values] : sets) {
    EXPECT_EQ(values_of(name), values) << name;
    for (const std::string& v : values) EXPECT_EQ(parse_error(name, v), "") << name << "=" << v;
  }
  const std::tuple<std::string, int64_t, int64_t> ranges[] = {
      {"QTK_AMX_PREFETCH", 0, Tuning::kAmxPrefetchModes - 1},
      {"QTK_GEMM_REF_M", 1, Tuning::kGemmRefMMax},
      {"QTK_FUSED_MAX_M", 0, Tuning::kFusedMaxMMax},
  };
  for (const auto& [name, lo, hi] : ranges) {
    EXPECT_EQ(values_of(name), std::vector<std::string>{fmt::format("{}..{}", lo, hi)}) << name;
    EXPECT_EQ(parse_error(name, std::to_string(lo)), "") << name;
    EXPECT_EQ(parse_error(name, std::to_string(hi)), "") << name;
    EXPECT_NE(parse_error(name, std::to_string(lo - 1)), "") << name;
    EXPECT_NE(parse_error(name, std::to_string(hi + 1)), "") << name;
  }
}

TEST(Tuning, SetTuningValidatesAndIsWhatTuningReturns) {
  Tuning t;
  t.fused_max_m = 17;
  EXPECT_EQ(error_of([&] { set_tuning(t); }),
            "QTK_FUSED_MAX_M: expected an integer 0..16, found '17'");
  t = Tuning{};
  t.gdn_state_columns = 8;
  EXPECT_NE(error_of([&] { set_tuning(t); }).find("QTK_GDN_STATE_COLUMNS"), std::string::npos);
  t = Tuning{};
  t.gemm_slices = 2;
  EXPECT_NE(error_of([&] { set_tuning(t); }).find("QTK_GEMM_SLICES"), std::string::npos);
  t = Tuning{};
  t.mma_wide = 48;
  EXPECT_NE(error_of([&] { set_tuning(t); }).find("QTK_MMA_WIDE"), std::string::npos);
  t = Tuning{};
  t.cpu_path = "sse";
  EXPECT_NE(error_of([&] { set_tuning(t); }).find("QTK_CPU_PATH"), std::string::npos);
  t = Tuning{};
  t.gemm_ref_m = 64;
  t.plan_cache = "off";
  set_tuning(t);
  EXPECT_EQ(tuning().gemm_ref_m, 64);
  EXPECT_EQ(tuning().plan_cache, "off");
}

TEST(Tuning, HeaderRecordsEverySwitchAndThePathUsed) {
  const nlohmann::json h = tuning_header(Tuning{});
  EXPECT_EQ(h.size(), Tuning{}.entries().size());
  EXPECT_EQ(h.size(), 18u);
  EXPECT_EQ(h["QTK_MEM_AVAILABLE"], 0);
  EXPECT_EQ(h["QTK_CPU_PATH"], std::string(cpu_path_name(supported_cpu_paths().back())));
  EXPECT_EQ(h["QTK_GEMM_REF_M"], 128);
  EXPECT_EQ(h["QTK_PDL"], 1);
  EXPECT_EQ(h["QTK_PLAN_CACHE"], "");
  Tuning t;
  t.cpu_path = "scalar";
  t.hugepages = false;
  EXPECT_EQ(tuning_header(t)["QTK_CPU_PATH"], "scalar");
  EXPECT_EQ(tuning_header(t)["QTK_HUGEPAGES"], 0);
}

// check_resume on a run header alone (no lines, no results yet), for a
// device this machine may lack: `old` is the header of the run being resumed.
std::string resume_error(const std::string& device, const Tuning& old_t, const Tuning& now_t,
                         bool old_has_tuning = true) {
  const std::string dir = work_dir() + "/tuning-resume";
  std::filesystem::create_directories(dir);
  auto header = [&](const Tuning& t) {
    nlohmann::json m = {{"pack", {{"digest", "xxh64:0"}}},
                        {"settings", {{"device", device}}},
                        {"tuning", tuning_header(t)},
                        {"input_line_xxh64", ""}};
    return m;
  };
  nlohmann::json old = header(old_t);
  if (!old_has_tuning) old.erase("tuning");
  ResumeSource source{true, dir + "/out.partial", dir + "/out.partial.meta.json"};
  write_text(source.meta, old.dump());
  write_text(source.path, "");
  return error_of([&] { check_resume(source, header(now_t), {}, "prompts.jsonl", 512); });
}

TEST(Tuning, ResumeRefusesAChangedResultSwitchOnItsDevice) {
  Tuning a, b;
  b.gemm_ref_m = 64;
  EXPECT_EQ(resume_error("cuda", a, b),
            fmt::format("{}/tuning-resume/out.partial.meta.json: cannot resume: QTK_GEMM_REF_M "
                        "was 128, now 64 (it can change tokens and margins on cuda)",
                        work_dir()));
  for (auto change :
       {+[](Tuning& t) { t.gemm_alternates = false; }, +[](Tuning& t) { t.fused_max_m = 4; },
        +[](Tuning& t) { t.gdn_chunked = false; }}) {
    Tuning c;
    change(c);
    EXPECT_NE(resume_error("cuda", a, c), "");
    EXPECT_EQ(resume_error("cpu", a, c), "");  // the CUDA switches do not act on the CPU
  }
  Tuning s;
  s.cpu_path = "scalar";
  const std::string e = resume_error("cpu", s, a);
  EXPECT_NE(e.find("QTK_CPU_PATH was \"scalar\""), std::string::npos) << e;
  EXPECT_EQ(resume_error("cuda", s, a), "");
}

TEST(Tuning, ResumeAcceptsUnchangedAndSpeedOnlySwitches) {
  Tuning a, b;
  b.amx_prefetch = 3;
  b.tiled = false;
  b.hugepages = false;
  b.gdn_state_columns = 16;
  b.pdl = false;
  b.cuda_graphs = false;
  b.pipeline = false;
  b.plan_cache = "off";
  for (const char* device : {"cpu", "cuda"}) {
    EXPECT_EQ(resume_error(device, a, a), "");
    EXPECT_EQ(resume_error(device, a, b), "");
  }
  // A header of an older qtk (no "tuning") counts as what that build
  // computed: the defaults, except QTK_GEMM_SLICES, which such a build ran
  // as 1 (one chain over K).
  EXPECT_EQ(resume_error("cpu", a, a, /*old_has_tuning=*/false), "");
  Tuning one_chain;
  one_chain.gemm_slices = 1;
  EXPECT_EQ(resume_error("cuda", a, one_chain, /*old_has_tuning=*/false), "");
  EXPECT_EQ(resume_error("cuda", a, a, /*old_has_tuning=*/false),
            fmt::format("{}/tuning-resume/out.partial.meta.json: cannot resume: QTK_GEMM_SLICES "
                        "was 1, now 4 (it can change tokens and margins on cuda)",
                        work_dir()));
  Tuning r = one_chain;
  r.gemm_ref_m = 256;
  EXPECT_NE(resume_error("cuda", a, r, /*old_has_tuning=*/false), "");  // now 256, not the default
}

// ---- through the generate program ----

const char* kTiny = "tests/data/models/qwen3-tiny";

std::string prompts_file(const std::string& name, int n) {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += nlohmann::json{{"id", i}, {"prompt_token_ids", {1 + i, 2, 3}}, {"max_tokens", 3}}.dump() +
         "\n";
  const std::string path = work_dir() + "/" + name;
  write_text(path, s);
  return path;
}

TEST(TuningGenerate, BadSwitchStopsTheRunWithItsName) {
  const std::string pack = pack_of(kTiny);
  const std::string in = prompts_file("tuning-bad.jsonl", 1);
  for (const auto& [env, message] :
       {std::pair{"QTK_FUSED_MAX_M=abc", "QTK_FUSED_MAX_M: expected an integer 0..16, found 'abc'"},
        std::pair{"QTK_PDL=yes", "QTK_PDL: expected 0 or 1, found 'yes'"},
        std::pair{"QTK_CPU_PATH=sse", "QTK_CPU_PATH: expected scalar, avx2, avx512 or amx"}}) {
    const std::string out = work_dir() + "/tuning-bad.jsonl.out";
    RunResult r = run(
        fmt::format("{} {} --model {} --batch {} --out {}", env, QTK_GENERATE_BIN, pack, in, out));
    EXPECT_EQ(r.status, 1) << env << ": " << r.err;
    EXPECT_NE(r.err.find(std::string("generate: ") + message), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << env;
  }
}

TEST(TuningGenerate, HelpListsTheSwitches) {
  RunResult r = run(fmt::format("{} --help", QTK_GENERATE_BIN));
  EXPECT_EQ(r.status, 0);
  for (const TuningEntry& e : Tuning{}.entries())
    EXPECT_NE(r.out.find(e.name), std::string::npos) << e.name;
}

TEST(TuningGenerate, RunHeaderRecordsTheSwitches) {
  const std::string pack = pack_of(kTiny);
  const std::string in = prompts_file("tuning-meta.jsonl", 2);
  const std::string out = work_dir() + "/tuning-meta.out.jsonl";
  RunResult r =
      run(fmt::format("QTK_AMX_PREFETCH=3 QTK_HUGEPAGES=0 QTK_GEMM_REF_M=64 {} --model {} "
                      "--batch {} --out {} --plan-cache off",
                      QTK_GENERATE_BIN, pack, in, out));
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json t = load_json(out + ".meta.json")["tuning"];
  EXPECT_EQ(t.size(), 18u) << t.dump();
  EXPECT_EQ(t["QTK_MMA_MATMUL"], 1);
  EXPECT_EQ(t["QTK_AMX_PREFETCH"], 3);
  EXPECT_EQ(t["QTK_HUGEPAGES"], 0);
  EXPECT_EQ(t["QTK_GEMM_REF_M"], 64);
  EXPECT_EQ(t["QTK_TILED"], 1);
  EXPECT_EQ(t["QTK_PLAN_CACHE"], "off");  // the flag over the environment
  EXPECT_EQ(t["QTK_CPU_PATH"], std::string(cpu_path_name(active_cpu_path())));
}

// A run cut after its first line (the results and header of a complete run,
// as an interrupted one leaves them), then resumed under `env`.
RunResult resume_under(const std::string& first_env, const std::string& env,
                       const std::string& name, std::string* expected) {
  const std::string pack = pack_of(kTiny);
  const std::string in = prompts_file(name + ".jsonl", 4);
  const std::string full = work_dir() + "/" + name + ".full.jsonl";
  EXPECT_EQ(run(fmt::format("{} {} --model {} --batch {} --out {} --force", first_env,
                            QTK_GENERATE_BIN, pack, in, full))
                .status,
            0);
  *expected = read_text(full);
  const std::string part = work_dir() + "/" + name + ".part.jsonl";
  write_killed_run(part, expected->substr(0, expected->find('\n') + 1), full + ".meta.json");
  RunResult r = run(fmt::format("{} {} --model {} --batch {} --out {} --resume", env,
                                QTK_GENERATE_BIN, pack, in, part));
  if (r.status == 0) {
    EXPECT_EQ(read_text(part), *expected) << name;
  }
  return r;
}

TEST(TuningGenerate, ResumeRefusesAnotherCpuPath) {
  const std::string best(cpu_path_name(supported_cpu_paths().back()));
  if (best == "scalar") GTEST_SKIP() << "this CPU has the scalar path only";
  std::string expected;
  RunResult r = resume_under("QTK_CPU_PATH=scalar", "", "tuning-path", &expected);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find(fmt::format("cannot resume: QTK_CPU_PATH was \"scalar\", now \"{}\"", best)),
            std::string::npos)
      << r.err;
}

TEST(TuningGenerate, ResumeAcceptsTheSameAndSpeedOnlySwitches) {
  std::string expected;
  RunResult same =
      resume_under("QTK_CPU_PATH=scalar", "QTK_CPU_PATH=scalar", "tuning-same", &expected);
  EXPECT_EQ(same.status, 0) << same.err;
  RunResult speed = resume_under("", "QTK_HUGEPAGES=0 QTK_TILED=0 QTK_AMX_PREFETCH=0 QTK_PDL=0",
                                 "tuning-speed", &expected);
  EXPECT_EQ(speed.status, 0) << speed.err;
}

}  // namespace
}  // namespace qtk::rt_test
