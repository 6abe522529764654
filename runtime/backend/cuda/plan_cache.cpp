#include "runtime/backend/cuda/plan_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "core/error.h"

namespace qtk {
namespace {

constexpr const char* kFormat = "qtk-gemm-plans";
constexpr int64_t kVersion = 1;

using Json = nlohmann::json;
using cuda::GemmPlanRecord;
using cuda::GemmRangeChoice;
using cuda::LtAlgoBytes;

// A short rendering of a JSON value for messages.
std::string shown(const Json& j) {
  std::string s = j.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Field access with messages that name the file and the field.
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {}

  [[noreturn]] void bad(const std::string& field, const std::string& expected,
                        const Json& found) const {
    fail(
        "{}: field '{}': expected {}, found {}; the file is ignored (delete it or run "
        "generate --tune-only to rebuild it)",
        path_, field, expected, shown(found));
  }
  const Json& get(const Json& obj, const std::string& parent, const char* name) const {
    const std::string field = parent.empty() ? name : parent + "." + name;
    auto it = obj.find(name);
    if (it == obj.end())
      fail(
          "{}: field '{}' is missing; the file is ignored (delete it or run generate "
          "--tune-only to rebuild it)",
          path_, field);
    return *it;
  }
  std::string string(const Json& obj, const std::string& parent, const char* name) const {
    const Json& v = get(obj, parent, name);
    if (!v.is_string()) bad(join(parent, name), "a string", v);
    return v.get<std::string>();
  }
  int64_t integer(const Json& obj, const std::string& parent, const char* name, int64_t min,
                  const char* expected) const {
    const Json& v = get(obj, parent, name);
    if (!v.is_number_integer() || v.get<int64_t>() < min) bad(join(parent, name), expected, v);
    return v.get<int64_t>();
  }
  bool boolean(const Json& obj, const std::string& parent, const char* name) const {
    const Json& v = get(obj, parent, name);
    if (!v.is_boolean()) bad(join(parent, name), "true or false", v);
    return v.get<bool>();
  }
  DType dtype(const Json& obj, const std::string& parent, const char* name) const {
    const Json& v = get(obj, parent, name);
    if (v.is_string()) {
      const auto t = parse_dtype(v.get<std::string>());
      if (t == DType::BF16 || t == DType::F32) return *t;
    }
    bad(join(parent, name), "\"BF16\" or \"F32\"", v);
  }
  LtAlgoBytes algo(const Json& obj, const std::string& parent, const char* name) const {
    const Json& v = get(obj, parent, name);
    LtAlgoBytes a{};
    const char* expected = "128 hexadecimal digits (a cuBLASLt algorithm)";
    if (!v.is_string() || v.get<std::string>().size() != 128) bad(join(parent, name), expected, v);
    const std::string s = v.get<std::string>();
    for (size_t w = 0; w < a.size(); ++w) {
      uint64_t word = 0;
      for (size_t i = 0; i < 16; ++i) {
        const char c = s[w * 16 + i];
        int d = -1;
        if (c >= '0' && c <= '9') d = c - '0';
        if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        if (d < 0) bad(join(parent, name), expected, v);
        word = word << 4 | static_cast<uint64_t>(d);
      }
      a[w] = word;
    }
    return a;
  }
  static std::string join(const std::string& parent, const char* name) {
    return parent.empty() ? std::string(name) : parent + "." + name;
  }

 private:
  std::string path_;
};

std::string algo_hex(const LtAlgoBytes& a) {
  std::string s;
  for (uint64_t w : a) s += fmt::format("{:016x}", w);
  return s;
}

const char* use_name(GemmRangeChoice::Use u) {
  switch (u) {
    case GemmRangeChoice::Use::kPlan:
      return "plan";
    case GemmRangeChoice::Use::kLt:
      return "cublaslt";
    case GemmRangeChoice::Use::kOwn:
      return "own";
  }
  return "plan";
}

// FNV-1a, 64 bits: a stable file name from the key's text.
uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

Json plan_cache_key_json(const PlanCacheKey& k) {
  return Json{{"gpu", k.gpu},           {"compute_capability", k.compute_capability},
              {"driver", k.driver},     {"cuda_runtime", k.cuda_runtime},
              {"cublaslt", k.cublaslt}, {"kernels", k.kernels},
              {"ref_m", k.ref_m},       {"model", k.model}};
}

std::string plan_cache_key_mismatch(const PlanCacheKey& file, const PlanCacheKey& run) {
  const Json a = plan_cache_key_json(file), b = plan_cache_key_json(run);
  std::string diff;
  for (auto it = b.begin(); it != b.end(); ++it) {
    const Json& was = a.at(it.key());
    if (was == it.value()) continue;
    diff += fmt::format("{}{}: the file has {}, this run {}", diff.empty() ? "" : "; ", it.key(),
                        shown(was), shown(it.value()));
  }
  return diff;
}

std::string plan_cache_file_name(const PlanCacheKey& key) {
  // note: nlohmann::json orders object keys, so the text (and the name) is
  // the same for equal keys in every build.
  return fmt::format("{:016x}.json", fnv1a(plan_cache_key_json(key).dump()));
}

std::string default_plan_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  // note: the XDG base directory spec says a relative XDG_CACHE_HOME is
  // invalid and must be ignored.
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/qtk/plans";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') return std::string(home) + "/.cache/qtk/plans";
  return {};
}

PlanCacheContents parse_plan_cache(std::string_view text, const std::string& path) {
  const Json doc = Json::parse(text, nullptr, false);
  if (doc.is_discarded())
    fail(
        "{}: not valid JSON; the file is ignored (delete it or run generate --tune-only to "
        "rebuild it)",
        path);
  Reader r(path);
  if (!doc.is_object()) r.bad("(top level)", "a JSON object", doc);
  if (r.string(doc, "", "format") != kFormat)
    r.bad("format", fmt::format("\"{}\"", kFormat), doc["format"]);
  const int64_t version = r.integer(doc, "", "version", 0, "an integer");
  if (version != kVersion)
    r.bad("version", fmt::format("{} (the format this qtk reads)", kVersion), doc["version"]);

  PlanCacheContents c;
  const Json& key = r.get(doc, "", "key");
  if (!key.is_object()) r.bad("key", "an object", key);
  c.key.gpu = r.string(key, "key", "gpu");
  c.key.compute_capability = r.string(key, "key", "compute_capability");
  c.key.driver = r.integer(key, "key", "driver", 0, "a non-negative integer");
  c.key.cuda_runtime = r.integer(key, "key", "cuda_runtime", 0, "a non-negative integer");
  c.key.cublaslt = r.integer(key, "key", "cublaslt", 0, "a non-negative integer");
  c.key.kernels = r.string(key, "key", "kernels");
  c.key.ref_m = r.integer(key, "key", "ref_m", 1, "a positive integer");
  c.key.model = r.string(key, "key", "model");
  if (auto t = doc.find("tuned_on"); t != doc.end() && t->is_object()) {
    c.pack_digest = t->value("pack_digest", "");
    c.tool_version = t->value("tool_version", "");
  }

  const Json& plans = r.get(doc, "", "plans");
  if (!plans.is_array()) r.bad("plans", "an array", plans);
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int>> seen;
  for (size_t i = 0; i < plans.size(); ++i) {
    const std::string f = fmt::format("plans[{}]", i);
    const Json& pj = plans[i];
    if (!pj.is_object()) r.bad(f, "an object", pj);
    GemmPlanRecord p;
    p.n = r.integer(pj, f, "n", 1, "a positive integer");
    p.k = r.integer(pj, f, "k", 1, "a positive integer");
    p.ldx = r.integer(pj, f, "ldx", p.k, fmt::format("an integer >= k ({})", p.k).c_str());
    p.ldw = r.integer(pj, f, "ldw", p.k, fmt::format("an integer >= k ({})", p.k).c_str());
    p.ldy = r.integer(pj, f, "ldy", p.n, fmt::format("an integer >= n ({})", p.n).c_str());
    p.in = r.dtype(pj, f, "in");
    p.out = r.dtype(pj, f, "out");
    if (p.in == DType::F32 && p.out != DType::F32)
      r.bad(f + ".out", "\"F32\" (F32 inputs give an F32 output)", pj["out"]);
    p.algo = r.algo(pj, f, "algo");
    if (!seen.insert(
                 {p.n, p.k, p.ldx, p.ldw, p.ldy, static_cast<int>(p.in), static_cast<int>(p.out)})
             .second)
      r.bad(f, "one entry per shape class (n, k, ldx, ldw, ldy, in, out)",
            "a repeat of an earlier entry");
    const Json& ranges = r.get(pj, f, "ranges");
    if (!ranges.is_array()) r.bad(f + ".ranges", "an array", ranges);
    std::set<std::pair<int64_t, int64_t>> ranges_seen;
    for (size_t j = 0; j < ranges.size(); ++j) {
      const std::string g = fmt::format("{}.ranges[{}]", f, j);
      const Json& rj = ranges[j];
      if (!rj.is_object()) r.bad(g, "an object", rj);
      GemmRangeChoice c2;
      c2.lo = r.integer(rj, g, "lo", 1, "a positive integer");
      const Json& hi = r.get(rj, g, "hi");
      if (hi.is_null()) {
        c2.hi = cuda::kGemmOpenRangeEnd;
      } else {
        c2.hi = r.integer(rj, g, "hi", c2.lo,
                          fmt::format("null (open) or an integer >= lo ({})", c2.lo).c_str());
      }
      const std::string use = r.string(rj, g, "use");
      if (use == "plan") {
        c2.use = GemmRangeChoice::Use::kPlan;
      } else if (use == "cublaslt") {
        c2.use = GemmRangeChoice::Use::kLt;
        c2.algo = r.algo(rj, g, "algo");
      } else if (use == "own") {
        c2.use = GemmRangeChoice::Use::kOwn;
      } else {
        r.bad(g + ".use", "\"plan\", \"cublaslt\" or \"own\"", rj["use"]);
      }
      c2.own_equal = r.boolean(rj, g, "own_equal");
      if (c2.use == GemmRangeChoice::Use::kOwn && !c2.own_equal)
        r.bad(g + ".own_equal", "true (the own kernel serves a range only where bit-equal)",
              rj["own_equal"]);
      if (!ranges_seen.insert({c2.lo, c2.hi}).second)
        r.bad(g, "one entry per M range", "a repeat of an earlier range");
      p.ranges.push_back(c2);
    }
    c.plans.push_back(std::move(p));
  }
  return c;
}

std::string serialize_plan_cache(const PlanCacheContents& c) {
  Json plans = Json::array();
  for (const GemmPlanRecord& p : c.plans) {
    Json ranges = Json::array();
    for (const GemmRangeChoice& r : p.ranges) {
      Json rj = {{"lo", r.lo},
                 {"hi", r.hi == cuda::kGemmOpenRangeEnd ? Json(nullptr) : Json(r.hi)},
                 {"use", use_name(r.use)},
                 {"own_equal", r.own_equal}};
      if (r.use == GemmRangeChoice::Use::kLt) rj["algo"] = algo_hex(r.algo);
      ranges.push_back(std::move(rj));
    }
    plans.push_back({{"n", p.n},
                     {"k", p.k},
                     {"ldx", p.ldx},
                     {"ldw", p.ldw},
                     {"ldy", p.ldy},
                     {"in", std::string(dtype_name(p.in))},
                     {"out", std::string(dtype_name(p.out))},
                     {"algo", algo_hex(p.algo)},
                     {"ranges", std::move(ranges)}});
  }
  const Json doc = {
      {"format", kFormat},
      {"version", kVersion},
      {"key", plan_cache_key_json(c.key)},
      {"tuned_on", {{"pack_digest", c.pack_digest}, {"tool_version", c.tool_version}}},
      {"plans", std::move(plans)}};
  return doc.dump(1) + "\n";
}

PlanCacheLoad load_plan_cache(const std::string& path, const PlanCacheKey& key) {
  PlanCacheLoad l;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    l.found = ::access(path.c_str(), F_OK) == 0;
    l.note = l.found ? fmt::format("{}: cannot be read ({}); tuning from scratch", path,
                                   std::strerror(errno))
                     : fmt::format("no GEMM plan cache at {} yet; tuning from scratch", path);
    return l;
  }
  l.found = true;
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    l.note = fmt::format("{}: cannot be read; tuning from scratch", path);
    return l;
  }
  PlanCacheContents c;
  try {
    c = parse_plan_cache(ss.str(), path);
  } catch (const Error& e) {
    l.note = fmt::format("{}; tuning from scratch", e.what());
    return l;
  }
  if (const std::string diff = plan_cache_key_mismatch(c.key, key); !diff.empty()) {
    l.note = fmt::format("{}: made for another setup ({}); ignoring it and tuning from scratch",
                         path, diff);
    return l;
  }
  l.plans = std::move(c.plans);
  l.used = true;
  return l;
}

void write_plan_cache(const std::string& path, const PlanCacheContents& contents) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    if (ec)
      fail("{}: cannot create the directory {} ({})", path, p.parent_path().string(), ec.message());
  }
  const std::string data = serialize_plan_cache(contents);
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(fmt::format("{}: cannot create the temporary file {}", path, tmp));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = e;
      fail_errno(fmt::format("{}: cannot write {}", path, tmp));
    }
    done += static_cast<size_t>(n);
  }
  int e = 0;
  if (::fsync(fd) != 0) e = errno;
  if (::close(fd) != 0 && e == 0) e = errno;
  if (e != 0) {
    ::unlink(tmp.c_str());
    errno = e;
    fail_errno(fmt::format("{}: cannot flush {}", path, tmp));
  }
  // note: rename within one directory replaces the file atomically: a
  // reader (another generate) sees the old file or the new one, never a
  // part; two runs finishing together leave one of their files whole.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    fail_errno(fmt::format("{}: cannot rename {} into place", path, tmp));
  }
}

}  // namespace qtk
