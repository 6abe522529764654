#include "runtime/shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/json.h"
#include "core/read_file.h"
#include "runtime/generate_resume.h"
#include "runtime/results_file.h"

namespace qtk {

namespace {

constexpr int64_t kMaxShards = 1000000;

// A whole decimal number in 0..max, or -1.
int64_t whole_number(std::string_view s, int64_t max) {
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty() || v < 0 || v > max) return -1;
  return v;
}

ShardSpec checked(const std::string& flag, int64_t k, int64_t n, const std::string& found) {
  if (n < 1 || k < 0 || k >= n)
    fail("{}: expected K/N with 0 <= K < N <= {} (or auto), found {}", flag, kMaxShards, found);
  return ShardSpec{k, n};
}

// One environment variable as a whole number in 0..max, or -1 when unset.
// note: task ids and an array's first id may be large (a Slurm array
// --array=2000000-2000003); only the count is bounded by kMaxShards.
constexpr int64_t kMaxTaskId = int64_t{1} << 40;
int64_t env_number(const std::string& flag, const std::function<const char*(const char*)>& getenv,
                   const char* name, int64_t max) {
  const char* v = getenv(name);
  if (v == nullptr) return -1;
  const int64_t n = whole_number(v, max);
  if (n < 0)
    fail("{} auto: environment variable {}: expected a whole number 0..{}, found \"{}\"", flag,
         name, max, v);
  return n;
}

}  // namespace

ShardSpec parse_shard(const std::string& flag, const std::string& text,
                      const std::function<const char*(const char*)>& getenv) {
  if (text == "auto") {
    const int64_t id = env_number(flag, getenv, "SLURM_ARRAY_TASK_ID", kMaxTaskId);
    if (id >= 0) {
      const int64_t count = env_number(flag, getenv, "SLURM_ARRAY_TASK_COUNT", kMaxShards);
      const int64_t min =
          std::max<int64_t>(0, env_number(flag, getenv, "SLURM_ARRAY_TASK_MIN", kMaxTaskId));
      if (count < 0)
        fail("{} auto: SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not", flag);
      // note: an array --array=1-4 numbers its tasks from 1; the shard index
      // counts from the array's first task. A stepped or sparse array
      // (--array=0-7:2, 1,5,9) is not one shard per task: refused below
      // when the index falls outside 0..count-1.
      return checked(flag, id - min, count,
                     fmt::format("SLURM_ARRAY_TASK_ID {} of a SLURM_ARRAY_TASK_COUNT {}-task array "
                                 "starting at SLURM_ARRAY_TASK_MIN {}",
                                 id, count, min));
    }
    const int64_t index = env_number(flag, getenv, "JOB_COMPLETION_INDEX", kMaxShards);
    if (index >= 0) {
      const int64_t count = env_number(flag, getenv, "QTK_SHARD_COUNT", kMaxShards);
      if (count < 0)
        fail(
            "{} auto: JOB_COMPLETION_INDEX is set but QTK_SHARD_COUNT is not (set it to the "
            "Indexed Job's completions)",
            flag);
      return checked(flag, index, count,
                     fmt::format("JOB_COMPLETION_INDEX {} of QTK_SHARD_COUNT {}", index, count));
    }
    fail(
        "{} auto: found neither SLURM_ARRAY_TASK_ID (a Slurm job array) nor "
        "JOB_COMPLETION_INDEX (a Kubernetes Indexed Job) in the environment",
        flag);
  }
  const size_t slash = text.find('/');
  if (slash == std::string::npos)
    fail("{}: expected K/N (0-based shard K of N) or auto, found \"{}\"", flag, text);
  const int64_t k = whole_number(std::string_view(text).substr(0, slash), kMaxShards);
  const int64_t n = whole_number(std::string_view(text).substr(slash + 1), kMaxShards);
  return checked(flag, k, n, fmt::format("\"{}\"", text));
}

nlohmann::json shard_json(const ShardSpec& s, int64_t lines_total,
                          const std::string& batch_digest) {
  return {{"index", s.index},
          {"count", s.count},
          {"lines_total", lines_total},
          {"lines", s.lines_of(lines_total)},
          {"rule", "input lines whose 0-based position modulo count is index"},
          {"batch_digest", batch_digest}};
}

namespace {

struct ShardFile {
  std::string path;
  nlohmann::json meta;
  ShardSpec spec;
  std::vector<std::string_view> lines;
  std::string text;  // owns `lines`
};

ShardFile load_shard(const std::string& path) {
  ShardFile f;
  f.path = path;
  const std::string meta_path = path + ".meta.json";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    struct stat partial {};
    if (::stat((path + ".partial").c_str(), &partial) == 0)
      fail(
          "{}: not there, only {}.partial: the shard has not finished (finish it with `generate "
          "--shard K/N --resume`, the shard's own command plus --resume)",
          path, path);
    fail("{}: no such file (expected the results of a `generate --shard K/N` run)", path);
  }
  if (S_ISDIR(st.st_mode))
    fail("{}: is a directory; expected the results of a `generate --shard K/N` run", path);
  f.meta =
      nlohmann::json::parse(read_file_text(meta_path, "the shard's meta file"), nullptr, false);
  if (f.meta.is_discarded() || !f.meta.is_object())
    fail("{}: expected the JSON meta file generate writes next to {}, found malformed JSON",
         meta_path, path);
  const nlohmann::json* shard = f.meta.contains("shard") ? &f.meta["shard"] : nullptr;
  if (!shard || !shard->is_object() || !(*shard)["index"].is_number_integer() ||
      !(*shard)["count"].is_number_integer() || !(*shard)["lines_total"].is_number_integer())
    fail("{}: field 'shard': expected the record of a `generate --shard K/N` run, found {}",
         meta_path, shard ? shard->dump() : "nothing (not a shard)");
  f.spec = ShardSpec{(*shard)["index"].get<int64_t>(), (*shard)["count"].get<int64_t>()};
  const std::string status = f.meta.value("status", std::string());
  if (status != "complete")
    fail(
        "{}: field 'status': expected \"complete\", found \"{}\" (finish the shard with "
        "`generate --shard {}/{} --resume` first)",
        meta_path, status, f.spec.index, f.spec.count);
  f.text = read_file_text(path, "the shard's results");
  if (!f.text.empty() && f.text.back() != '\n')
    fail("{}: the last line is incomplete (the shard did not finish)", path);
  // note: the digest is what shows the lines are the shard's own: without
  // it an edited line (a token, two lines swapped) would pass into the
  // merged file and get a fresh digest there.
  const auto d = f.meta.find("results_xxh64");
  if (d == f.meta.end() || !d->is_string())
    fail(
        "{}: field 'results_xxh64': expected the XXH64 of the shard's results, which generate "
        "records when a shard completes, found {} (an older qtk's shard, or an edited meta "
        "file), so its lines cannot be checked; run the shard again with --force",
        meta_path, d == f.meta.end() ? "none" : d->dump());
  const std::string now = results_digest(f.text);
  if (now != d->get<std::string>())
    fail(
        "{}: its XXH64 is {}, but {} says {} (the results were changed after the shard "
        "completed, or the meta file is another shard's)",
        path, now, meta_path, d->get<std::string>());
  f.lines = split_lines(f.text);
  return f;
}

// A shard header's text for a first look, or "" where it cannot be read or
// is not a plain file of a header's size (load_shard reports those).
std::string header_text(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (64 << 20)) return {};
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Stops a merge that a signal (recorded by merge's InterruptScope) asked to
// stop, before anything is written.
void stop_if_interrupted(const std::string& out, const std::string& meta) {
  if (const int sig = interrupt_signal())
    fail("{}: interrupted by {}; {} and {} are as they were", out, signal_name(sig), out, meta);
}

// The meta fields that must agree between the shards of one job.
const char* const kSameInEveryShard[] = {
    "/pack/digest",
    "/settings/max_tokens_default",
    "/settings/ignore_eos",
    "/settings/margins",
    "/settings/device",
    "/settings/precision",
    "/shard/count",
    "/shard/lines_total",
    "/shard/batch_digest",
    // note: by its XXH64: one template named by different paths is one job's.
    "/settings/chat_template/xxh64",
    "/settings/tensor_parallel",
    "/settings/logprobs",
    "/settings/allow_unknown_fields",
};

}  // namespace

MergeResult run_merge(const MergeOptions& o) {
  if (o.shards.empty()) fail("expected OUT.jsonl and at least one SHARD.jsonl");
  if (o.out == "-")
    fail("OUT: expected a file path, found '-' (merge writes OUT.jsonl and OUT.jsonl.meta.json)");
  const ResultsPaths paths = ResultsPaths::of(o.out, o.meta);
  const std::string& out_meta = paths.meta;
  // note: --force must never replace an input: the merge would destroy the
  // shard it reads (generate refuses the same for its own inputs).
  std::vector<std::pair<std::string, std::string>> inputs;
  for (const std::string& p : o.shards) {
    inputs.emplace_back("shard", p);
    inputs.emplace_back("shard header", p + ".meta.json");
    for (const std::string& in : {p, p + ".meta.json"})
      for (const std::string& target : {o.out, out_meta})
        if (same_file(target, in))
          fail("{}: is the shard file {} (merge would overwrite its own input)", target, in);
    // note: and not the prompts file, pack or chat template the shard's
    // header names (as generate refuses them for its own outputs), seen from
    // here; a header that cannot be read is reported by load_shard below.
    const nlohmann::json meta =
        nlohmann::json::parse(header_text(p + ".meta.json"), nullptr, false);
    if (meta.is_object()) {
      for (const auto& [what, pointer] :
           {std::pair{"prompts", "/batch"}, std::pair{"pack", "/pack/path"},
            std::pair{"chat template", "/settings/chat_template/path"}}) {
        const nlohmann::json v =
            meta.value(nlohmann::json::json_pointer(pointer), nlohmann::json());
        if (v.is_string() && !v.get_ref<const std::string&>().empty() && v != "-")
          inputs.emplace_back(fmt::format("{} (named by {}.meta.json)", what, p),
                              v.get<std::string>());
      }
    }
  }
  // note: generate's checks of its outputs: an existing directory, OUT not a
  // directory, device or FIFO (written by rename, they would become plain
  // files: `merge /dev/full ... --force` replaced the device), no input.
  // (a caller that recorded what was at OUT decided itself whether it may
  // be replaced)
  const bool may_replace = o.force || o.at_start.has_value();
  refuse_outputs_that_are_inputs(paths, inputs, may_replace, "merge", "OUT");
  std::optional<OutputLock> lock;
  if (o.lock) {
    lock.emplace(paths.lock, o.out);
    // note: with the lock held no other generate or merge writes these
    // names: what a killed one left of its temporary files can go.
    for (const std::string& line : remove_stale_temporaries(paths))
      std::fprintf(stderr, "merge: %s\n", line.c_str());
  }
  // What was at OUT and its header now (or when the caller took the lock):
  // without --force the final move replaces only those files, never one
  // that appears there meanwhile.
  const OutputsAtStart at_start = o.at_start ? *o.at_start : OutputsAtStart::of(paths, o.force);
  if (!may_replace) {
    for (const std::string& p : {o.out, out_meta}) {
      struct stat st {};
      if (::lstat(p.c_str(), &st) == 0)
        fail("{}: already exists (pass --force to replace {})", p,
             p == o.out ? "it" : "it and " + o.out);
    }
  }
  std::vector<ShardFile> shards;
  for (const std::string& p : o.shards) shards.push_back(load_shard(p));
  stop_if_interrupted(o.out, out_meta);

  const ShardFile& first = shards.front();
  bool all_verified = true;
  for (const ShardFile& s : shards) {
    for (const char* field : kSameInEveryShard) {
      const nlohmann::json::json_pointer ptr(field);
      const nlohmann::json a = first.meta.value(ptr, nlohmann::json());
      const nlohmann::json b = s.meta.value(ptr, nlohmann::json());
      if (a != b)
        fail("{}.meta.json: field '{}' is {}, but {} has {} (the shards are not of one job)",
             s.path, std::string(field).substr(1), b.dump(), first.path, a.dump());
    }
    // note: the switches that change results on the shards' device
    // (QTK_CPU_PATH: a Slurm array over nodes with and without AVX-512),
    // compared as --resume compares them.
    if (const TuningDifference d = result_tuning_difference(first.meta, s.meta); !d.name.empty())
      fail(
          "{}.meta.json: field 'tuning/{}' is {}, but {} has {} (the shards are not of one job: "
          "it changes tokens and margins)",
          s.path, d.name, d.now.dump(), first.path, d.was.dump());
    all_verified =
        all_verified && s.meta.value(nlohmann::json::json_pointer("/settings/verify_checksums"),
                                     nlohmann::json(false)) == true;
  }
  const int64_t count = first.spec.count;
  const int64_t total = first.meta["shard"]["lines_total"].get<int64_t>();
  // The shard the merge makes: the whole batch (0/1), or `as_shard`.
  const ShardSpec whole = o.as_shard.value_or(ShardSpec{});
  if (count % whole.count != 0)
    fail("{}: a shard of {} cannot be a sub-shard of shard {}/{} (expected a multiple of {})",
         first.path, count, whole.index, whole.count, whole.count);
  std::map<int64_t, const ShardFile*> by_index;
  for (const ShardFile& s : shards) {
    if (s.spec.index % whole.count != whole.index)
      fail("{}: shard {}/{} holds no lines of shard {}/{}", s.path, s.spec.index, count,
           whole.index, whole.count);
    auto [it, fresh] = by_index.emplace(s.spec.index, &s);
    if (!fresh)
      fail("{}: shard {}/{} is given twice (also {})", s.path, s.spec.index, count,
           it->second->path);
    const int64_t want = s.spec.lines_of(total);
    if (static_cast<int64_t>(s.lines.size()) != want)
      fail("{}: expected {} result lines for shard {}/{} of {} input lines, found {}", s.path, want,
           s.spec.index, count, total, s.lines.size());
  }
  const int64_t expected = count / whole.count;
  for (int64_t k = whole.index; k < count; k += whole.count)
    if (!by_index.count(k))
      fail("shard {}/{} is missing (given: {} of {} shards)", k, count, by_index.size(), expected);

  // note: input line i is line i / count of shard i % count; the merged
  // file holds the lines i = whole.index + whole.count * t in order.
  // note: each line is checked to be one of generate's result lines, and
  // no id may have two results (a reused id gets an error line, so error
  // lines may repeat one): a line copied in from another shard would
  // otherwise merge silently.
  std::string merged;
  MergeResult result;
  result.lines = whole.lines_of(total);
  std::map<std::string, std::string> result_of;  // id (JSON text) -> where its result is
  for (int64_t t = 0; t < result.lines; ++t) {
    const int64_t i = whole.index + whole.count * t;
    const ShardFile& s = *by_index[i % count];
    const std::string_view line = s.lines[static_cast<size_t>(i / count)];
    const std::string where = fmt::format("{}: line {}", s.path, i / count + 1);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("id"))
      fail("{}: expected a result line of generate (a JSON object with an 'id'), found {}", where,
           j.is_discarded() ? std::string("malformed JSON") : std::string(j.type_name()));
    if (j.contains("error")) {
      ++result.error_lines;
    } else if (auto [it, fresh] = result_of.emplace(j["id"].dump(), where); !fresh) {
      fail("{}: id {} has a result already ({}): expected one result per id", where, j["id"].dump(),
           it->second);
    }
    merged.append(line);
    merged.push_back('\n');
  }
  // note: the header is made from the lowest shard's, not the first one
  // named, so the merged header does not depend on the argument order.
  nlohmann::json meta = by_index.begin()->second->meta;
  meta.erase("shard");
  meta.erase("resumed_from");  // (each shard's stays in its merged_from entry)
  // note: a top-level entry some shard has another value of (or lacks:
  // `devices` of a shard run with --devices, the CUDA start-up of each
  // process) is kept per shard in its merged_from entry, not reported as
  // one shard's for the whole job; so is a --devices shard's own
  // merged_from (its workers).
  std::vector<std::string> own_entries;
  {
    std::set<std::string> keys;
    for (const auto& [k, s] : by_index)
      for (const auto& [key, value] : s->meta.items()) keys.insert(key);
    for (const std::string& key : keys) {
      if (key == "settings" || key == "tuning" || key == "stats" || key == "status" ||
          key == "results_xxh64" || key == "shard" || key == "resumed_from")
        continue;
      // (a shard's merged_from, its workers, is always its own)
      bool same = key != "merged_from" && meta.contains(key);
      for (const auto& [k, s] : by_index)
        same = same && s->meta.value(key, nlohmann::json()) == meta[key];
      if (!same) {
        own_entries.push_back(key);
        meta.erase(key);
      }
    }
  }
  // note: the whole job's pack was checked only if every shard's was.
  if (meta.contains("settings") && meta["settings"].contains("verify_checksums"))
    meta["settings"]["verify_checksums"] = all_verified;
  if (o.as_shard)
    meta["shard"] =
        shard_json(whole, total, first.meta["shard"].value("batch_digest", std::string()));
  // note: the shards of one job may run with other scheduling settings
  // (threads, --max-num-seqs, the KV cache: results do not depend on them);
  // a setting some shard ran with another value of is kept per shard in
  // its merged_from entry, not reported as shard 0's for the whole job.
  // So is a tuning switch (a speed-only one may differ): the header's
  // "tuning" keeps the switches every shard ran with alike.
  std::map<std::string, std::vector<std::string>> differing;  // "settings" / "tuning" -> keys
  for (const char* section : {"settings", "tuning"}) {
    const auto st = meta.find(section);
    if (st == meta.end() || !st->is_object()) continue;
    std::vector<std::string>& keys = differing[section];
    for (const auto& [key, value] : st->items()) {
      if (std::string_view(section) == "settings" && key == "verify_checksums")
        continue;  // (all shards', above)
      for (const auto& [k, s] : by_index)
        if (s->meta.value(section, nlohmann::json::object()).value(key, nlohmann::json()) !=
            value) {
          keys.push_back(key);
          break;
        }
    }
    for (const std::string& key : keys) st->erase(key);
  }
  // note: each shard's own stats (timings, memory) stay with its entry;
  // the merged stats hold only what adds up: lines and token counts.
  meta["merged_from"] = nlohmann::json::array();
  meta["stats"] = {{"lines", result.lines}};
  int64_t prompt_tokens = 0, generated_tokens = 0, capped_lines = 0;
  bool counted = true, capped_counted = true;
  for (const auto& [k, s] : by_index) {
    nlohmann::json entry = {{"shard", k}, {"path", s->path}};
    for (const auto& [section, keys] : differing) {
      if (keys.empty()) continue;
      const nlohmann::json own = s->meta.value(section, nlohmann::json::object());
      entry[section] = nlohmann::json::object();
      for (const std::string& key : keys)
        if (own.contains(key)) entry[section][key] = own[key];
    }
    const nlohmann::json stats = s->meta.value("stats", nlohmann::json());
    if (stats.is_object()) entry["stats"] = stats;
    if (const auto r = s->meta.find("resumed_from"); r != s->meta.end()) entry["resumed_from"] = *r;
    for (const std::string& key : own_entries)
      if (const auto e = s->meta.find(key); e != s->meta.end()) entry[key] = *e;
    if (stats.is_object() &&
        stats.value("context_capped_lines", nlohmann::json()).is_number_integer())
      capped_lines += stats["context_capped_lines"].get<int64_t>();
    else
      capped_counted = false;
    if (stats.is_object() && stats.value("prompt_tokens", nlohmann::json()).is_number_integer() &&
        stats.value("generated_tokens", nlohmann::json()).is_number_integer()) {
      prompt_tokens += stats["prompt_tokens"].get<int64_t>();
      generated_tokens += stats["generated_tokens"].get<int64_t>();
    } else {
      counted = false;
    }
    meta["merged_from"].push_back(entry);
  }
  if (counted) {
    meta["stats"]["prompt_tokens"] = prompt_tokens;
    meta["stats"]["generated_tokens"] = generated_tokens;
  }
  if (capped_counted) meta["stats"]["context_capped_lines"] = capped_lines;
  for (const auto& [key, value] : o.extra.items()) meta[key] = value;
  meta["status"] = "complete";
  meta["results_xxh64"] = results_digest(merged);
  // note: as generate completes a run (move_results_into_place): the
  // results in a file of their own beside OUT, the header renamed into
  // place, then the results; a failure (a full disk, an OUT that cannot be
  // replaced, one that appeared meanwhile) leaves OUT and its header as
  // they were, and a kill between the two renames leaves a header whose
  // results_xxh64 names the old OUT as not its results (merge again).
  stop_if_interrupted(o.out, out_meta);
  const std::string staged = fmt::format("{}.merge.{}", o.out, ::getpid());
  {
    // note: created as a new file (O_EXCL | O_NOFOLLOW; a leftover of a
    // process that had our pid goes first): never written through a link.
    ::unlink(staged.c_str());
    const int fd =
        ::open(staged.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) fail_errno(fmt::format("{}: cannot create the merged results beside it", o.out));
    register_emergency_unlink(staged);
    bool closed = false;
    try {
      write_all(fd, merged, o.out);
      if (::fsync(fd) != 0) fail_errno(fmt::format("{}: fsync failed", o.out));
      closed = true;
      if (::close(fd) != 0) fail_errno(fmt::format("{}: write failed", o.out));
    } catch (...) {
      if (!closed) ::close(fd);
      ::unlink(staged.c_str());
      unregister_emergency_unlink(staged);
      throw;
    }
  }
  FinalMove move;
  move.staged = staged;
  move.out = o.out;
  move.meta = out_meta;
  move.header = json_file_text(meta, 2) + "\n";
  move.force = at_start.force;
  move.out_at_start = at_start.out;
  move.meta_at_start = at_start.meta;
  move.doing = o.doing;
  try {
    move_results_into_place(move);
  } catch (...) {
    ::unlink(staged.c_str());  // (gone already where the results were moved)
    unregister_emergency_unlink(staged);
    throw;
  }
  unregister_emergency_unlink(staged);
  return result;
}

}  // namespace qtk
