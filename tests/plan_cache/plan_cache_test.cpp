// The GEMM plan cache file (runtime/backend/cuda/plan_cache.h) without a GPU: the
// round trip of every field, the rejection of corrupt files with a message
// naming the file and the field, key matching, the default location, and
// the atomic write.
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/backend/cuda/plan_cache.h"

namespace qtk {
namespace {

using cuda::GemmPlanRecord;
using cuda::GemmRangeChoice;
using Json = nlohmann::json;

std::string scratch_dir() {
  static const std::string dir = [] {
    const std::string d = fmt::format("{}/plan-cache-work-{}", QTK_TEST_WORK_DIR, ::getpid());
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

PlanCacheKey sample_key() {
  PlanCacheKey k;
  k.gpu = "NVIDIA H100 80GB HBM3";
  k.compute_capability = "9.0";
  k.driver = 12080;
  k.cuda_runtime = 12090;
  k.cublaslt = 120904;
  k.kernels = "0123456789abcdef cuda 12090";
  k.ref_m = 128;
  k.model = "qwen3 bf16: vocab 151936 hidden 1024";
  return k;
}

// Two shape classes: every kind of range, an open last range, words whose
// top bits are set (hex of full 64-bit values).
PlanCacheContents sample_contents() {
  PlanCacheContents c;
  c.key = sample_key();
  c.pack_digest = "xxh64:1234";
  c.tool_version = "0.1.0";
  GemmPlanRecord a;
  a.n = 3072;
  a.k = 1024;
  a.ldx = 1024;
  a.ldw = 1024;
  a.ldy = 3072;
  a.in = DType::BF16;
  a.out = DType::F32;
  for (size_t i = 0; i < a.algo.size(); ++i) a.algo[i] = 0xfedcba9876543210ull ^ (i * 0x1111);
  GemmRangeChoice own;
  own.lo = 1;
  own.hi = 16;
  own.use = GemmRangeChoice::Use::kOwn;
  own.own_equal = true;
  GemmRangeChoice lt;
  lt.lo = 2048;
  lt.hi = cuda::kGemmOpenRangeEnd;
  lt.use = GemmRangeChoice::Use::kLt;
  for (size_t i = 0; i < lt.algo.size(); ++i) lt.algo[i] = i == 0 ? ~0ull : i;
  GemmRangeChoice plan;
  plan.lo = 65;
  plan.hi = 511;
  a.ranges = {own, lt, plan};
  GemmPlanRecord b;
  b.n = 1000;
  b.k = 36;
  b.ldx = 40;
  b.ldw = 36;
  b.ldy = 1000;
  b.in = DType::F32;
  b.out = DType::F32;
  b.algo[3] = 7;
  c.plans = {a, b};
  return c;
}

void expect_same(const GemmPlanRecord& a, const GemmPlanRecord& b) {
  EXPECT_EQ(a.n, b.n);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.ldx, b.ldx);
  EXPECT_EQ(a.ldw, b.ldw);
  EXPECT_EQ(a.ldy, b.ldy);
  EXPECT_EQ(a.in, b.in);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.algo, b.algo);
  ASSERT_EQ(a.ranges.size(), b.ranges.size());
  for (size_t i = 0; i < a.ranges.size(); ++i) {
    EXPECT_EQ(a.ranges[i].lo, b.ranges[i].lo) << i;
    EXPECT_EQ(a.ranges[i].hi, b.ranges[i].hi) << i;
    EXPECT_EQ(a.ranges[i].use, b.ranges[i].use) << i;
    EXPECT_EQ(a.ranges[i].own_equal, b.ranges[i].own_equal) << i;
    if (a.ranges[i].use == GemmRangeChoice::Use::kLt) {
      EXPECT_EQ(a.ranges[i].algo, b.ranges[i].algo) << i;
    }
  }
}

TEST(PlanCache, RoundTripKeepsEveryField) {
  const PlanCacheContents c = sample_contents();
  const std::string text = serialize_plan_cache(c);
  const PlanCacheContents d = parse_plan_cache(text, "x.json");
  EXPECT_TRUE(plan_cache_key_mismatch(c.key, d.key).empty());
  EXPECT_EQ(d.pack_digest, c.pack_digest);
  EXPECT_EQ(d.tool_version, c.tool_version);
  ASSERT_EQ(d.plans.size(), c.plans.size());
  for (size_t i = 0; i < c.plans.size(); ++i) expect_same(c.plans[i], d.plans[i]);
  // The same text again (stable output: a rewrite of an unchanged plan is
  // byte-identical).
  EXPECT_EQ(serialize_plan_cache(d), text);
}

TEST(PlanCache, AlgorithmsAreSixteenHexDigitsPerWord) {
  const Json doc = Json::parse(serialize_plan_cache(sample_contents()));
  const std::string algo = doc["plans"][0]["ranges"][1]["algo"];
  ASSERT_EQ(algo.size(), 128u);
  EXPECT_EQ(algo.substr(0, 32), "ffffffffffffffff0000000000000001");
  EXPECT_TRUE(doc["plans"][0]["ranges"][1]["hi"].is_null()) << "the open range is written as null";
  EXPECT_FALSE(doc["plans"][0]["ranges"][0].contains("algo")) << "only cuBLASLt ranges have one";
  // Upper-case digits are read too.
  Json up = doc;
  std::string a = up["plans"][0]["algo"];
  for (char& ch : a) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  up["plans"][0]["algo"] = a;
  EXPECT_EQ(parse_plan_cache(up.dump(), "u.json").plans[0].algo, sample_contents().plans[0].algo);
}

// Each corruption must be refused with a message naming the file and the
// field.
struct Corruption {
  const char* name;
  const char* field;  // expected in the message
  void (*edit)(Json&);
};

TEST(PlanCache, CorruptFilesAreRefusedNamingTheField) {
  const Json good = Json::parse(serialize_plan_cache(sample_contents()));
  const Corruption cases[] = {
      {"format", "format", [](Json& j) { j["format"] = "something-else"; }},
      {"version", "version", [](Json& j) { j["version"] = 2; }},
      {"no key", "key", [](Json& j) { j.erase("key"); }},
      {"key gpu type", "key.gpu", [](Json& j) { j["key"]["gpu"] = 5; }},
      {"key driver", "key.driver", [](Json& j) { j["key"]["driver"] = "new"; }},
      {"key ref_m", "key.ref_m", [](Json& j) { j["key"]["ref_m"] = 0; }},
      {"plans type", "plans", [](Json& j) { j["plans"] = Json::object(); }},
      {"n", "plans[0].n", [](Json& j) { j["plans"][0]["n"] = -3; }},
      {"ldx < k", "plans[0].ldx", [](Json& j) { j["plans"][0]["ldx"] = 10; }},
      {"dtype", "plans[1].in", [](Json& j) { j["plans"][1]["in"] = "F16"; }},
      {"f32 in bf16 out", "plans[1].out", [](Json& j) { j["plans"][1]["out"] = "BF16"; }},
      {"algo short", "plans[0].algo", [](Json& j) { j["plans"][0]["algo"] = "abc"; }},
      {"algo not hex", "plans[0].algo",
       [](Json& j) { j["plans"][0]["algo"] = std::string(127, '0') + "g"; }},
      {"range use", "plans[0].ranges[2].use",
       [](Json& j) { j["plans"][0]["ranges"][2]["use"] = "fast"; }},
      {"own not equal", "plans[0].ranges[0].own_equal",
       [](Json& j) { j["plans"][0]["ranges"][0]["own_equal"] = false; }},
      {"lt without algo", "plans[0].ranges[1].algo",
       [](Json& j) { j["plans"][0]["ranges"][1].erase("algo"); }},
      {"hi < lo", "plans[0].ranges[2].hi", [](Json& j) { j["plans"][0]["ranges"][2]["hi"] = 3; }},
      {"repeated range", "plans[0].ranges[3]",
       [](Json& j) { j["plans"][0]["ranges"].push_back(j["plans"][0]["ranges"][0]); }},
      {"repeated plan", "plans[2]", [](Json& j) { j["plans"].push_back(j["plans"][0]); }},
  };
  for (const Corruption& c : cases) {
    Json j = good;
    c.edit(j);
    try {
      parse_plan_cache(j.dump(), "/some/dir/plans.json");
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("/some/dir/plans.json"), std::string::npos) << c.name << ": " << m;
      EXPECT_NE(m.find(std::string("'") + c.field + "'"), std::string::npos) << c.name << ": " << m;
    }
  }
  for (const char* text : {"", "{", "not json at all", "[1, 2]", "null"}) {
    try {
      parse_plan_cache(text, "/p.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("/p.json: ", 0), 0u) << e.what();
    }
  }
}

TEST(PlanCache, KeyMismatchNamesEachDifferingField) {
  const PlanCacheKey k = sample_key();
  EXPECT_EQ(plan_cache_key_mismatch(k, k), "");
  struct Edit {
    const char* field;
    void (*edit)(PlanCacheKey&);
  };
  const Edit edits[] = {
      {"gpu", [](PlanCacheKey& x) { x.gpu = "NVIDIA H200"; }},
      {"compute_capability", [](PlanCacheKey& x) { x.compute_capability = "10.0"; }},
      {"driver", [](PlanCacheKey& x) { x.driver += 10; }},
      {"cuda_runtime", [](PlanCacheKey& x) { x.cuda_runtime = 13000; }},
      {"cublaslt", [](PlanCacheKey& x) { x.cublaslt = 130001; }},
      {"kernels", [](PlanCacheKey& x) { x.kernels = "other"; }},
      {"ref_m", [](PlanCacheKey& x) { x.ref_m = 1; }},
      {"model", [](PlanCacheKey& x) { x.model = "qwen3 f32: vocab 151936 hidden 1024"; }},
  };
  for (const Edit& e : edits) {
    PlanCacheKey other = k;
    e.edit(other);
    const std::string m = plan_cache_key_mismatch(other, k);
    EXPECT_NE(m.find(std::string(e.field) + ":"), std::string::npos) << e.field << ": " << m;
    EXPECT_NE(plan_cache_file_name(other), plan_cache_file_name(k)) << e.field;
  }
  PlanCacheKey two = k;
  two.gpu = "A";
  two.driver = 1;
  const std::string m = plan_cache_key_mismatch(two, k);
  EXPECT_NE(m.find("gpu:"), std::string::npos) << m;
  EXPECT_NE(m.find("driver:"), std::string::npos) << m;
}

TEST(PlanCache, FileNameIsAStableHashOfTheKey) {
  const std::string n = plan_cache_file_name(sample_key());
  EXPECT_EQ(n, plan_cache_file_name(sample_key()));
  ASSERT_EQ(n.size(), 16u + 5u);
  EXPECT_EQ(n.substr(16), ".json");
  EXPECT_EQ(n.find_first_not_of("0123456789abcdef"), 16u);
}

// Sets an environment variable for one scope, restoring it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(PlanCache, DefaultDirectoryFollowsXdgThenHome) {
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg/cache");
    ScopedEnv home("HOME", "/home/u");
    EXPECT_EQ(default_plan_cache_dir(), "/xdg/cache/qtk/plans");
  }
  {
    // A relative XDG_CACHE_HOME is invalid by the spec and ignored.
    ScopedEnv xdg("XDG_CACHE_HOME", "relative/cache");
    ScopedEnv home("HOME", "/home/u");
    EXPECT_EQ(default_plan_cache_dir(), "/home/u/.cache/qtk/plans");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", "/home/u");
    EXPECT_EQ(default_plan_cache_dir(), "/home/u/.cache/qtk/plans");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", nullptr);
    EXPECT_EQ(default_plan_cache_dir(), "");
  }
}

TEST(PlanCache, LoadUsesOnlyAValidFileWithTheSameKey) {
  const std::string dir = scratch_dir();
  const PlanCacheKey key = sample_key();
  // Missing.
  PlanCacheLoad l = load_plan_cache(dir + "/missing.json", key);
  EXPECT_FALSE(l.found);
  EXPECT_FALSE(l.used);
  EXPECT_NE(l.note.find(dir + "/missing.json"), std::string::npos) << l.note;
  // Corrupt: a warning naming the file, nothing used.
  write_text(dir + "/corrupt.json", "{\"format\": \"qtk-gemm-plans\", \"version\": 1, \"key\": 3}");
  l = load_plan_cache(dir + "/corrupt.json", key);
  EXPECT_TRUE(l.found);
  EXPECT_FALSE(l.used);
  EXPECT_TRUE(l.plans.empty());
  EXPECT_NE(l.note.find(dir + "/corrupt.json"), std::string::npos) << l.note;
  EXPECT_NE(l.note.find("'key'"), std::string::npos) << l.note;
  // Truncated in the middle (a write that did not go through rename).
  const std::string full = serialize_plan_cache(sample_contents());
  write_text(dir + "/cut.json", full.substr(0, full.size() / 2));
  l = load_plan_cache(dir + "/cut.json", key);
  EXPECT_FALSE(l.used);
  EXPECT_NE(l.note.find("not valid JSON"), std::string::npos) << l.note;
  // Foreign: another GPU.
  PlanCacheContents foreign = sample_contents();
  foreign.key.gpu = "Some Other GPU";
  write_plan_cache(dir + "/foreign.json", foreign);
  l = load_plan_cache(dir + "/foreign.json", key);
  EXPECT_TRUE(l.found);
  EXPECT_FALSE(l.used);
  EXPECT_TRUE(l.plans.empty());
  EXPECT_NE(l.note.find("gpu:"), std::string::npos) << l.note;
  EXPECT_NE(l.note.find("Some Other GPU"), std::string::npos) << l.note;
  // Matching.
  write_plan_cache(dir + "/good.json", sample_contents());
  l = load_plan_cache(dir + "/good.json", key);
  EXPECT_TRUE(l.used) << l.note;
  EXPECT_EQ(l.note, "");
  ASSERT_EQ(l.plans.size(), 2u);
  expect_same(l.plans[0], sample_contents().plans[0]);
}

TEST(PlanCache, WriteCreatesTheDirectoryAndLeavesNoTemporaryFile) {
  const std::string dir = scratch_dir() + "/deep/er/plans";
  const std::string path = dir + "/p.json";
  write_plan_cache(path, sample_contents());
  EXPECT_EQ(read_text(path), serialize_plan_cache(sample_contents()));
  // Replacing an existing file.
  PlanCacheContents c = sample_contents();
  c.plans.pop_back();
  write_plan_cache(path, c);
  EXPECT_EQ(parse_plan_cache(read_text(path), path).plans.size(), 1u);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "p.json");
  }
  EXPECT_EQ(files, 1);
}

TEST(PlanCache, WriteFailureNamesThePath) {
  const std::string dir = scratch_dir();
  // A regular file where the directory would have to be.
  write_text(dir + "/blocker", "x");
  const std::string path = dir + "/blocker/sub/p.json";
  try {
    write_plan_cache(path, sample_contents());
    ADD_FAILURE() << "wrote under a regular file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qtk
