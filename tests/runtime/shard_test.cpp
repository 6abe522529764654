// Sharded batch jobs through the real programs: `generate --shard K/N` tasks
// joined by `merge` give the single run's results file byte for byte; the
// shard flag's parsing; merge's refusals, each naming the shard.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "core/error.h"
#include "runtime/results_file.h"
#include "runtime/shard.h"
#include "tests/runtime/output_faults.h"
#include "tests/runtime/test_util.h"

namespace qtk::rt_test {
namespace {

std::string merge_cmd(const std::string& args) { return fmt::format("{} {}", QTK_MERGE_BIN, args); }

// Text prompts of qwen3.5-sample, a duplicate id and a malformed line: the
// error lines must land where the single run puts them.
std::string shard_prompts() {
  const auto golden = load_json(src("samples/qwen3.5-sample/golden.json"));
  std::string s;
  int n = 0;
  for (const auto& c : golden["cases"]) {
    nlohmann::json j = {{"prompt", c["prompt"]}, {"max_tokens", 6 + (n % 5)}};
    if (n % 3 == 0) j["id"] = fmt::format("p{}", n);  // others keep the line-number id
    s += j.dump() + "\n";
    ++n;
  }
  s += "{\"id\": \"p0\", \"prompt\": \"again\"}\n";  // duplicate id
  s += "not json\n";
  return s;
}

struct ShardJob {
  std::string pack, prompts, full;
};

const ShardJob& job() {
  static ShardJob j = [] {
    ShardJob s;
    s.pack = pack_of("samples/qwen3.5-sample");
    s.prompts = work_dir() + "/shard_prompts.jsonl";
    write_text(s.prompts, shard_prompts());
    s.full = work_dir() + "/shard_full.jsonl";
    const RunResult r = generate(s.pack, s.prompts, s.full, "--margins --threads 2");
    EXPECT_EQ(r.status == 0 || r.status == 3, true) << r.err;
    return s;
  }();
  return j;
}

std::string run_shards(const std::string& tag, int n, const std::string& extra = "") {
  std::string files;
  for (int k = n - 1; k >= 0; --k) {  // merge order must not matter
    const std::string out = fmt::format("{}/{}_{}.jsonl", work_dir(), tag, k);
    const RunResult r =
        generate(job().pack, job().prompts, out,
                 fmt::format("--margins --threads 1 --shard {}/{} {}", k, n, extra));
    EXPECT_TRUE(r.status == 0 || r.status == 3) << r.err;
    files += " " + out;
  }
  return files;
}

TEST(Shard, MergedShardsAreTheSingleRunByteForByte) {
  for (int n : {1, 2, 3, 7, 25}) {  // 25: more shards than lines (22): some are empty
    const std::string files = run_shards(fmt::format("n{}", n), n, "--max-num-seqs 3");
    const std::string merged = fmt::format("{}/merged{}.jsonl", work_dir(), n);
    const RunResult m = run(merge_cmd(merged + files));
    // (3: the batch's duplicate id and malformed line are error lines, as
    // in the single run)
    ASSERT_EQ(m.status, 3) << m.err;
    EXPECT_NE(m.err.find("(22 lines, 2 error lines)"), std::string::npos) << m.err;
    EXPECT_EQ(read_text(merged), read_text(job().full)) << n << " shards";
    const auto meta = load_json(merged + ".meta.json");
    EXPECT_EQ(meta["status"], "complete");
    EXPECT_EQ(meta["merged_from"].size(), static_cast<size_t>(n));
    // The merged counts are the single run's (context-capped lines included).
    const auto whole = load_json(job().full + ".meta.json");
    for (const char* key : {"prompt_tokens", "generated_tokens", "context_capped_lines"})
      EXPECT_EQ(meta["stats"][key], whole["stats"][key]) << key << ", " << n << " shards";
  }
}

// The merged header is made from the lowest shard's whatever the order the
// shards are named in; what one shard has of its own (a --devices shard's
// `devices` and its workers' `merged_from`) stays in that shard's entry.
TEST(Shard, MergedHeaderDoesNotDependOnTheArgumentOrder) {
  const std::string a = work_dir() + "/ord_0.jsonl", b = work_dir() + "/ord_1.jsonl";
  const RunResult r0 =
      generate(job().pack, job().prompts, a, "--margins --threads 1 --shard 0/2 --devices 0,1");
  ASSERT_TRUE(r0.status == 0 || r0.status == 3) << r0.err;
  const RunResult r1 = generate(job().pack, job().prompts, b, "--margins --threads 1 --shard 1/2");
  ASSERT_TRUE(r1.status == 0 || r1.status == 3) << r1.err;
  ASSERT_TRUE(load_json(a + ".meta.json").contains("devices"));
  const std::string m1 = work_dir() + "/ord_ab.jsonl", m2 = work_dir() + "/ord_ba.jsonl";
  ASSERT_EQ(run(merge_cmd(fmt::format("{} {} {}", m1, a, b))).status, 3);
  ASSERT_EQ(run(merge_cmd(fmt::format("{} {} {}", m2, b, a))).status, 3);
  EXPECT_EQ(read_text(m1), read_text(job().full));
  EXPECT_EQ(read_text(m2), read_text(job().full));
  const nlohmann::json h1 = load_json(m1 + ".meta.json"), h2 = load_json(m2 + ".meta.json");
  EXPECT_EQ(h1, h2);
  EXPECT_FALSE(h1.contains("devices")) << h1.dump(2);
  ASSERT_EQ(h1["merged_from"].size(), 2u);
  EXPECT_EQ(h1["merged_from"][0]["devices"], load_json(a + ".meta.json")["devices"]);
  EXPECT_TRUE(h1["merged_from"][0]["merged_from"].is_array()) << h1.dump(2);
  EXPECT_FALSE(h1["merged_from"][1].contains("devices"));
}

// Shards run with other scheduling settings (results do not depend on
// them) merge into the single run's file; the merged header keeps such a
// setting per shard, not shard 0's value for the whole job.
TEST(Shard, SettingsThatDifferByShardAreKeptPerShard) {
  std::string files;
  for (int k = 0; k < 2; ++k) {
    const std::string out = fmt::format("{}/mixed_{}.jsonl", work_dir(), k);
    // (and a speed-only tuning switch, QTK_TILED, set differently)
    const RunResult r = run(fmt::format(
        "QTK_TILED={} {} --model {} --batch {} --out {} --margins --threads {} --max-num-seqs {} "
        "--shard {}/2",
        k, QTK_GENERATE_BIN, job().pack, job().prompts, out, k + 1, 3 + k, k));
    EXPECT_TRUE(r.status == 0 || r.status == 3) << r.err;
    files += " " + out;
  }
  const std::string merged = work_dir() + "/mixed.jsonl";
  const RunResult m = run(merge_cmd(merged + files));
  ASSERT_EQ(m.status, 3) << m.err;
  EXPECT_EQ(read_text(merged), read_text(job().full));
  const auto meta = load_json(merged + ".meta.json");
  EXPECT_FALSE(meta["settings"].contains("threads")) << meta["settings"].dump();
  EXPECT_FALSE(meta["settings"].contains("max_num_seqs")) << meta["settings"].dump();
  EXPECT_EQ(meta["settings"]["block_size"], 16);  // the same in both: kept
  // The tuning switches both ran with alike stay in the header; QTK_TILED
  // is each shard's.
  ASSERT_TRUE(meta.contains("tuning")) << meta.dump();
  EXPECT_TRUE(meta["tuning"].contains("QTK_CPU_PATH")) << meta["tuning"].dump();
  EXPECT_FALSE(meta["tuning"].contains("QTK_TILED")) << meta["tuning"].dump();
  ASSERT_EQ(meta["merged_from"].size(), 2u);
  for (int k = 0; k < 2; ++k) {
    const auto& own = meta["merged_from"][k]["settings"];
    EXPECT_EQ(own["threads"], k + 1) << own.dump();
    EXPECT_EQ(own["max_num_seqs"], 3 + k) << own.dump();
    EXPECT_FALSE(own.contains("block_size")) << own.dump();
    const auto& tuning = meta["merged_from"][k]["tuning"];
    EXPECT_EQ(tuning["QTK_TILED"], k) << tuning.dump();
    EXPECT_FALSE(tuning.contains("QTK_CPU_PATH")) << tuning.dump();
  }
}

TEST(Shard, ARetriedTaskFinishesItsShardOrDoesNothing) {
  const std::string files = run_shards("retry", 2);
  const std::string s0 = work_dir() + "/retry_0.jsonl";
  const std::string done = read_text(s0);
  // Complete: the same command again leaves the file as it is.
  RunResult again = generate(job().pack, job().prompts, s0, "--margins --shard 0/2");
  EXPECT_TRUE(again.status == 0 || again.status == 3) << again.err;
  EXPECT_NE(again.err.find("already complete"), std::string::npos) << again.err;
  EXPECT_EQ(read_text(s0), done);
  // Killed mid-line: what a kill leaves is OUT.partial (and its header,
  // "running"); the retry resumes after its complete lines.
  auto meta = load_json(s0 + ".meta.json");
  meta["status"] = "running";
  write_text(s0 + ".partial.meta.json", meta.dump(2));
  write_text(s0 + ".partial", done.substr(0, done.size() / 2));
  std::filesystem::remove(s0);
  std::filesystem::remove(s0 + ".meta.json");
  again = generate(job().pack, job().prompts, s0, "--margins --shard 0/2");
  EXPECT_TRUE(again.status == 0 || again.status == 3) << again.err;
  EXPECT_EQ(read_text(s0), done);
  EXPECT_FALSE(std::filesystem::exists(s0 + ".partial"));
  // Shard 1's first two lines swapped: the message names their lines of the
  // prompts file (2 and 4), not their places in the shard.
  {
    const std::string s1 = work_dir() + "/retry_1.jsonl";
    const std::string s1_done = read_text(s1);
    const size_t a = s1_done.find('\n') + 1, b = s1_done.find('\n', a) + 1;
    auto m1 = load_json(s1 + ".meta.json");
    m1["status"] = "running";
    m1.erase("results_xxh64");
    write_text(s1 + ".partial.meta.json", m1.dump(2));
    write_text(s1 + ".partial", s1_done.substr(a, b - a) + s1_done.substr(0, a));
    std::filesystem::rename(s1, s1 + ".keep");
    std::filesystem::rename(s1 + ".meta.json", s1 + ".keep.meta.json");
    const RunResult swapped = generate(job().pack, job().prompts, s1, "--margins --shard 1/2");
    EXPECT_EQ(swapped.status, 1) << swapped.err;
    const std::string id = nlohmann::json::parse(s1_done.substr(0, a))["id"].dump();
    EXPECT_NE(swapped.err.find("line 1 is not the result of " + job().prompts + " line 2 (id " +
                               id + ")"),
              std::string::npos)
        << swapped.err;
    // A header that is no run's (an empty object): said so, not "a whole run".
    write_text(s1 + ".partial.meta.json", "{}");
    const RunResult empty = generate(job().pack, job().prompts, s1, "--margins --shard 1/2");
    EXPECT_EQ(empty.status, 1) << empty.err;
    EXPECT_NE(empty.err.find("cannot resume: not a run header generate wrote"), std::string::npos)
        << empty.err;
    std::filesystem::remove(s1 + ".partial");
    std::filesystem::remove(s1 + ".partial.meta.json");
    std::filesystem::rename(s1 + ".keep", s1);
    std::filesystem::rename(s1 + ".keep.meta.json", s1 + ".meta.json");
  }
  // Another shard's command on this shard's file is refused.
  const RunResult wrong = generate(job().pack, job().prompts, s0, "--margins --shard 1/2");
  EXPECT_EQ(wrong.status, 1);
  EXPECT_NE(wrong.err.find("cannot resume: it holds shard 0/2, this run is shard 1/2"),
            std::string::npos)
      << wrong.err;
  // --resume of the shard's file without --shard names the shard to give;
  // --shard on a whole run's file says it is not a shard.
  const RunResult plain = generate(job().pack, job().prompts, s0, "--margins --resume");
  EXPECT_EQ(plain.status, 1);
  EXPECT_NE(plain.err.find("cannot resume: it holds shard 0/2; resume it with --shard 0/2"),
            std::string::npos)
      << plain.err;
  const RunResult whole = generate(job().pack, job().prompts, job().full, "--margins --shard 0/2");
  EXPECT_EQ(whole.status, 1);
  EXPECT_NE(whole.err.find("cannot resume: it holds a whole run, not a shard"), std::string::npos)
      << whole.err;
  EXPECT_EQ(read_text(s0), done);
}

// One stderr line starting "merge: ", as the other programs' messages do.
void expect_merge_message(const std::string& err) {
  EXPECT_EQ(err.rfind("merge: ", 0), 0u) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(err.find("merge: merge:"), std::string::npos) << err;
}

TEST(Shard, MergeMessagesNameTheProgram) {
  const std::string d = work_dir();
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {"", "merge: expected OUT.jsonl and at least one SHARD.jsonl (see --help)"},
      {d + "/mm.jsonl", "merge: expected OUT.jsonl and at least one SHARD.jsonl"},
      {d + "/mm.jsonl " + d + "/no-such-shard.jsonl", "merge: " + d + "/no-such-shard.jsonl"},
      {"--frobnicate " + d + "/mm.jsonl x.jsonl", "merge: "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const RunResult r = run(merge_cmd(c.args));
    EXPECT_EQ(r.status, 1);
    expect_merge_message(r.err);
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(d + "/mm.jsonl"));
  }
}

TEST(Shard, MergeRefusesWhatIsNotOneCompleteJob) {
  const std::string files = run_shards("bad", 3);
  const std::string d = work_dir();
  auto merge_err = [&](const std::string& args) {
    const RunResult r = run(merge_cmd(args));
    EXPECT_EQ(r.status, 1) << args;
    expect_merge_message(r.err);
    return r.err;
  };
  const std::string s0 = d + "/bad_0.jsonl", s1 = d + "/bad_1.jsonl", s2 = d + "/bad_2.jsonl";
  EXPECT_NE(merge_err(d + "/m1.jsonl " + s0 + " " + s1).find("shard 2/3 is missing"),
            std::string::npos);
  EXPECT_NE(merge_err(d + "/m2.jsonl " + s0 + " " + s1 + " " + s2 + " " + s1)
                .find("shard 1/3 is given twice"),
            std::string::npos);
  // Not a shard: the single run's file.
  EXPECT_NE(merge_err(d + "/m3.jsonl " + job().full).find("field 'shard'"), std::string::npos);
  // A shard of another prompts file (same line count, one prompt changed).
  const std::string other = d + "/shard_other.jsonl";
  std::string text = shard_prompts();
  text[text.find("\"prompt\": \"") + 11] ^= 1;
  write_text(other, text);
  const std::string o2 = d + "/other_2.jsonl";
  const RunResult r = generate(job().pack, other, o2, "--margins --shard 2/3");
  ASSERT_TRUE(r.status == 0 || r.status == 3) << r.err;
  EXPECT_NE(merge_err(d + "/m4.jsonl " + s0 + " " + s1 + " " + o2).find("shard/batch_digest"),
            std::string::npos);
  // Different settings.
  const std::string nm = d + "/nomargins_2.jsonl";
  const RunResult plain = generate(job().pack, job().prompts, nm, "--shard 2/3");
  ASSERT_TRUE(plain.status == 0 || plain.status == 3) << plain.err;
  EXPECT_NE(merge_err(d + "/m5.jsonl " + s0 + " " + s1 + " " + nm).find("settings/margins"),
            std::string::npos);
  // An unfinished shard.
  auto meta = load_json(s2 + ".meta.json");
  meta["status"] = "running";
  write_text(s2 + ".meta.json", meta.dump(2));
  EXPECT_NE(merge_err(d + "/m6.jsonl " + s0 + " " + s1 + " " + s2).find("expected \"complete\""),
            std::string::npos);
  // A shard that has only its partial results.
  const std::string unfinished = d + "/unfinished_1.jsonl";
  write_text(unfinished + ".partial", "");
  EXPECT_NE(merge_err(d + "/m6.jsonl " + s0 + " " + unfinished + " " + s2)
                .find("only " + unfinished + ".partial: the shard has not finished"),
            std::string::npos);
  // An existing output without --force.
  write_text(d + "/exists.jsonl", "x\n");
  meta["status"] = "complete";
  write_text(s2 + ".meta.json", meta.dump(2));
  EXPECT_NE(merge_err(d + "/exists.jsonl " + s0 + " " + s1 + " " + s2).find("already exists"),
            std::string::npos);
  EXPECT_EQ(read_text(d + "/exists.jsonl"), "x\n");
  // --force never replaces an input: OUT, or its meta file, is a shard's file.
  const std::string s0_text = read_text(s0), s1_meta = read_text(s1 + ".meta.json");
  for (const std::string& out : {s0, s1 + ".meta.json"})
    EXPECT_NE(merge_err("--force " + out + " " + s0 + " " + s1 + " " + s2)
                  .find("merge would overwrite its own input"),
              std::string::npos);
  EXPECT_EQ(read_text(s0), s0_text);
  EXPECT_EQ(read_text(s1 + ".meta.json"), s1_meta);
  // Nor the prompts file or the pack the shards' headers name (a copy of
  // each, made the shards' inputs by their headers).
  {
    const std::string prompts_copy = d + "/own-prompts.jsonl", pack_copy = d + "/own.pack";
    write_text(prompts_copy, read_text(job().prompts));
    std::filesystem::copy_file(job().pack, pack_copy,
                               std::filesystem::copy_options::overwrite_existing);
    const std::string m1 = read_text(s1 + ".meta.json");
    auto h = load_json(s1 + ".meta.json");
    h["batch"] = prompts_copy;
    h["pack"]["path"] = pack_copy;
    write_text(s1 + ".meta.json", h.dump(2));
    const std::string p_text = read_text(prompts_copy);
    for (const auto& [out, what] : {std::pair{prompts_copy, "the prompts (named by "},
                                    std::pair{pack_copy, "the pack (named by "}}) {
      const std::string err = merge_err("--force " + out + " " + s0 + " " + s1 + " " + s2);
      EXPECT_NE(err.find("merge would write " + out + ", which is " + what + s1 + ".meta.json)"),
                std::string::npos)
          << err;
      EXPECT_EQ(err.find("--out"), std::string::npos) << err;
    }
    EXPECT_EQ(read_text(prompts_copy), p_text);
    EXPECT_EQ(std::filesystem::file_size(pack_copy), std::filesystem::file_size(job().pack));
    write_text(s1 + ".meta.json", m1);
  }
  // A shard that is a directory, or not there.
  EXPECT_NE(merge_err(d + "/m6.jsonl " + s0 + " " + s1 + " " + d).find(d + ": is a directory"),
            std::string::npos);
  EXPECT_NE(merge_err(d + "/m6.jsonl " + s0 + " " + s1 + " " + d + "/nope.jsonl")
                .find("nope.jsonl: no such file"),
            std::string::npos);
  // OUT '-' (merge writes files, not standard output).
  EXPECT_NE(merge_err("- " + s0 + " " + s1 + " " + s2).find("found '-'"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists("-"));
  // A result line copied over another shard's: the shard's digest (in its
  // meta file) no longer matches; a meta file without the digest (an older
  // qtk's, or edited: missing or null) is refused, as its lines cannot be
  // checked.
  const std::string s1_text = read_text(s1), s2_text = read_text(s2);
  write_text(s1,
             s2_text.substr(0, s2_text.find('\n') + 1) + s1_text.substr(s1_text.find('\n') + 1));
  EXPECT_NE(merge_err(d + "/m7.jsonl " + s0 + " " + s1 + " " + s2)
                .find("the results were changed after the shard completed"),
            std::string::npos);
  auto s1_meta_json = load_json(s1 + ".meta.json");
  ASSERT_TRUE(s1_meta_json.contains("results_xxh64"));
  s1_meta_json.erase("results_xxh64");
  write_text(s1 + ".meta.json", s1_meta_json.dump(2));
  EXPECT_NE(merge_err(d + "/m7.jsonl " + s0 + " " + s1 + " " + s2)
                .find("field 'results_xxh64': expected the XXH64 of the shard's results, which "
                      "generate records when a shard completes, found none"),
            std::string::npos);
  s1_meta_json["results_xxh64"] = nullptr;
  write_text(s1 + ".meta.json", s1_meta_json.dump(2));
  EXPECT_NE(merge_err(d + "/m7.jsonl " + s0 + " " + s1 + " " + s2).find("found null"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(d + "/m7.jsonl"));
  write_text(s1, s1_text);
  write_text(s1 + ".meta.json", s1_meta);
  // Two shards' meta files swapped: each names the other's shard index.
  const std::string s0_meta = read_text(s0 + ".meta.json");
  write_text(s0 + ".meta.json", s1_meta);
  write_text(s1 + ".meta.json", s0_meta);
  EXPECT_NE(merge_err(d + "/m8.jsonl " + s0 + " " + s1 + " " + s2)
                .find("or the meta file is another shard's"),
            std::string::npos);
  write_text(s0 + ".meta.json", s0_meta);
  write_text(s1 + ".meta.json", s1_meta);
  EXPECT_EQ(run(merge_cmd(d + "/m9.jsonl " + s0 + " " + s1 + " " + s2)).status, 3);
  EXPECT_EQ(read_text(d + "/m9.jsonl"), read_text(job().full));
}

// merge writes its outputs as generate does: not over a device or FIFO, not
// over a header without --force, not under a running generate's lock; and it
// refuses shards whose results-changing switches or flags differ.
TEST(Shard, MergeChecksItsOutputsAndEverySettingAsGenerateDoes) {
  const std::string files = run_shards("chk", 2);
  const std::string d = work_dir();
  const std::string s0 = d + "/chk_0.jsonl", s1 = d + "/chk_1.jsonl";
  auto merge_err = [&](const std::string& args) {
    const RunResult r = run(merge_cmd(args));
    EXPECT_EQ(r.status, 1) << args << ": " << r.err;
    expect_merge_message(r.err);
    return r.err;
  };
  // A shard computed on another CPU path (a Slurm array over mixed nodes).
  const std::string scalar = d + "/chk_scalar_1.jsonl";
  RunResult r =
      run(fmt::format("QTK_CPU_PATH=scalar {} --model {} --batch {} --out {} --margins "
                      "--threads 1 --shard 1/2",
                      QTK_GENERATE_BIN, job().pack, job().prompts, scalar));
  ASSERT_TRUE(r.status == 0 || r.status == 3) << r.err;
  EXPECT_NE(merge_err(d + "/c1.jsonl " + s0 + " " + scalar).find("field 'tuning/QTK_CPU_PATH'"),
            std::string::npos);
  // A shard with --logprobs, one with --allow-unknown-fields.
  for (const auto& [flag, field] :
       {std::pair<std::string, std::string>{"--logprobs 2", "settings/logprobs"},
        {"--allow-unknown-fields", "settings/allow_unknown_fields"}}) {
    const std::string other = d + "/chk_other_1.jsonl";
    r = generate(job().pack, job().prompts, other,
                 "--margins --threads 1 --force --shard 1/2 " + flag);
    ASSERT_TRUE(r.status == 0 || r.status == 3) << r.err;
    EXPECT_NE(merge_err(d + "/c2.jsonl " + s0 + " " + other).find(field), std::string::npos)
        << flag;
    EXPECT_FALSE(std::filesystem::exists(d + "/c2.jsonl"));
  }
  // A FIFO as OUT, even with --force: it stays a FIFO.
  const std::string fifo = d + "/c3.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_NE(merge_err("--force " + fifo + " " + s0 + " " + s1).find("is a FIFO"),
            std::string::npos);
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  // A header without its results: kept unless --force.
  const std::string c4 = d + "/c4.jsonl";
  write_text(c4 + ".meta.json", "{\"precious\": true}\n");
  EXPECT_NE(merge_err(c4 + " " + s0 + " " + s1).find("c4.jsonl.meta.json: already exists"),
            std::string::npos);
  EXPECT_EQ(read_text(c4 + ".meta.json"), "{\"precious\": true}\n");
  EXPECT_FALSE(std::filesystem::exists(c4));
  // OUT.lock held (a generate writing OUT): refused, even with --force.
  const std::string c5 = d + "/c5.jsonl";
  const int fd = ::open((c5 + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  EXPECT_NE(merge_err("--force " + c5 + " " + s0 + " " + s1).find("is writing these results"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(c5));
  ::close(fd);
  // Then it merges, and leaves no lock or staging file behind.
  EXPECT_EQ(run(merge_cmd("--force " + c5 + " " + s0 + " " + s1)).status, 3);
  EXPECT_EQ(read_text(c5), read_text(job().full));
  EXPECT_EQ(load_json(c5 + ".meta.json")["settings"]["verify_checksums"], true);
  for (const auto& e : std::filesystem::directory_iterator(d)) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name.rfind("c5.jsonl", 0) != 0 || name == "c5.jsonl" ||
                name == "c5.jsonl.meta.json")
        << name;
  }
}

TEST(Shard, FlagParsing) {
  std::map<std::string, std::string> env;
  auto getenv = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  EXPECT_EQ(parse_shard("--shard", "2/5", getenv).index, 2);
  EXPECT_EQ(parse_shard("--shard", "2/5", getenv).count, 5);
  for (const char* bad : {"5/5", "-1/3", "1/0", "a/3", "1/3x", "3", "", "1/2000000"}) {
    try {
      parse_shard("--shard", bad, getenv);
      ADD_FAILURE() << bad << " accepted";
    } catch (const qtk::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--shard"), std::string::npos) << e.what();
    }
  }
  env = {
      {"SLURM_ARRAY_TASK_ID", "4"}, {"SLURM_ARRAY_TASK_COUNT", "4"}, {"SLURM_ARRAY_TASK_MIN", "1"}};
  const ShardSpec s = parse_shard("--shard", "auto", getenv);
  EXPECT_EQ(s.index, 3);
  EXPECT_EQ(s.count, 4);
  // An array of large task ids: only the count is bounded.
  env = {{"SLURM_ARRAY_TASK_ID", "2000001"},
         {"SLURM_ARRAY_TASK_COUNT", "4"},
         {"SLURM_ARRAY_TASK_MIN", "2000000"}};
  EXPECT_EQ(parse_shard("--shard", "auto", getenv).index, 1);
  env = {{"JOB_COMPLETION_INDEX", "0"}, {"QTK_SHARD_COUNT", "8"}};
  EXPECT_EQ(parse_shard("--shard", "auto", getenv).count, 8);
  // The messages name the variable that is out of range.
  auto message = [&] {
    try {
      parse_shard("--shard", "auto", getenv);
    } catch (const qtk::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  env = {{"JOB_COMPLETION_INDEX", "0"}, {"QTK_SHARD_COUNT", "0"}};
  EXPECT_NE(message().find("QTK_SHARD_COUNT 0"), std::string::npos) << message();
  env = {{"JOB_COMPLETION_INDEX", "0"}, {"QTK_SHARD_COUNT", "1000001"}};
  EXPECT_NE(message().find("QTK_SHARD_COUNT: expected a whole number 0..1000000"),
            std::string::npos)
      << message();
  env = {{"JOB_COMPLETION_INDEX", "0"}};
  EXPECT_THROW(parse_shard("--shard", "auto", getenv), qtk::Error);
  env.clear();
  EXPECT_THROW(parse_shard("--shard", "auto", getenv), qtk::Error);
}

// ---- merge's output files: written as generate writes its own ----

// The header of `out` says it is complete and names `out`'s own results.
void expect_merged_pair(const std::string& out) {
  const auto h = load_json(out + ".meta.json");
  EXPECT_EQ(h.value("status", ""), "complete");
  EXPECT_EQ(h.value("results_xxh64", ""), results_digest(read_text(out)));
}

// `out` (in `d`) holds the single run's results and its header pairs with
// them; nothing else in `d` starts with OUT's name.
void expect_only_the_merged_pair(const std::string& d, const std::string& out) {
  const std::string name = out.substr(out.rfind('/') + 1);
  EXPECT_EQ(read_text(out), read_text(job().full));
  expect_merged_pair(out);
  EXPECT_EQ(names_starting(d, name), (std::vector<std::string>{name, name + ".meta.json"}));
}

// merge never writes through a symbolic link: one at OUT.lock is refused
// naming it (a FIFO or a directory too), one at OUT.meta.json or at the
// pid-named staging and temporary names (made by a shell that then execs
// merge, which keeps its pid) is replaced, its target untouched.
TEST(Shard, MergeNeverWritesThroughSymlinks) {
  const std::string files = run_shards("mlink", 2);
  const std::string d = work_dir() + "/mlink";
  std::filesystem::create_directories(d);
  const std::string out = d + "/m.jsonl", lock = out + ".lock";
  const std::string victim = work_dir() + "/mlink.victim";
  write_text(victim, "precious\n");
  for (const std::string kind : {"a symbolic link", "a FIFO (named pipe)", "a directory"}) {
    if (kind == "a symbolic link") std::filesystem::create_symlink(victim, lock);
    if (kind == "a FIFO (named pipe)") {
      ASSERT_EQ(::mkfifo(lock.c_str(), 0644), 0);
    }
    if (kind == "a directory") std::filesystem::create_directory(lock);
    const RunResult r = run(merge_cmd("--force " + out + files));
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_EQ(r.err, fmt::format("merge: {}: the lock file {} is {}; expected a regular file or no "
                                 "file there (generate and merge create it; remove it)\n",
                                 out, lock, kind));
    EXPECT_EQ(names_starting(d, "m.jsonl"), std::vector<std::string>{"m.jsonl.lock"});
    std::filesystem::remove(lock);
  }
  // A hard link at the lock's name is refused; the file it names is unchanged.
  ASSERT_EQ(::link(victim.c_str(), lock.c_str()), 0);
  {
    const RunResult r = run(merge_cmd("--force " + out + files));
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_EQ(r.err, fmt::format("merge: {}: the lock file {} has 2 hard links; expected a file "
                                 "of its own (generate and merge create it; remove it)\n",
                                 out, lock));
    EXPECT_EQ(names_starting(d, "m.jsonl"), std::vector<std::string>{"m.jsonl.lock"});
    std::filesystem::remove(lock);
  }
  EXPECT_EQ(read_text(victim), "precious\n");
  std::vector<std::string> victims;
  std::string links;
  for (const std::string name :
       {".meta.json", ".merge.$$", ".meta.json.tmp.$$", ".meta.json.prev.$$"}) {
    const std::string v = fmt::format("{}.victim{}", d, victims.size());
    write_text(v, "precious\n");
    victims.push_back(v);
    links += fmt::format("ln -s {} {}{} && ", v, out, name);
  }
  const RunResult r = run(fmt::format("{}exec {} --force {}{}", links, QTK_MERGE_BIN, out, files));
  EXPECT_EQ(r.status, 3) << r.err;
  for (const std::string& v : victims) EXPECT_EQ(read_text(v), "precious\n") << v;
  EXPECT_FALSE(std::filesystem::is_symlink(out + ".meta.json"));
  expect_only_the_merged_pair(d, out);
}

// The final move keeps OUT and its header a pair, as README promises: a
// results rename that fails (an immutable OUT) puts the old header back;
// without --force an OUT or header that appears as it is made is kept (also
// on a file system without RENAME_NOREPLACE); a failed directory fsync is
// an error saying the results are in place. Nothing temporary is left.
TEST(Shard, MergeFinalMoveKeepsOutAndHeaderTogether) {
  const std::string files = run_shards("mpair", 2);
  const std::string d = work_dir() + "/mpair";
  std::filesystem::create_directories(d);
  const std::string out = d + "/m.jsonl", meta = out + ".meta.json";
  write_text(out, "old results\n");
  write_text(meta, "{\"old\": true}\n");
  const RunResult failed =
      run(with_faults("QTK_FAULT_RENAME_TO=" + out) + merge_cmd("--force " + out + files));
  EXPECT_EQ(failed.status, 1) << failed.err;
  EXPECT_EQ(failed.err, fmt::format("merge: {}: cannot move the completed results into place: "
                                    "Operation not permitted; {} and {} are as they were\n",
                                    out, out, meta));
  EXPECT_EQ(read_text(out), "old results\n");
  EXPECT_EQ(read_text(meta), "{\"old\": true}\n");
  EXPECT_EQ(names_starting(d, "m.jsonl"),
            (std::vector<std::string>{"m.jsonl", "m.jsonl.meta.json"}));
  std::filesystem::remove(out);
  std::filesystem::remove(meta);
  for (const std::string extra : {"", "QTK_FAULT_NO_RENAME_NOREPLACE=1"}) {
    for (const std::string& target : {out, meta}) {
      SCOPED_TRACE(target + " " + extra);
      const RunResult r = run(with_faults("QTK_FAULT_CREATE_AT_RENAME_TO=" + target + " " + extra) +
                              merge_cmd(out + files));
      EXPECT_EQ(r.status, 1) << r.err;
      EXPECT_EQ(r.err.rfind(fmt::format("merge: {}: appeared while merging (it was not there when "
                                        "the merge started); not replacing it",
                                        target),
                            0),
                0u)
          << r.err;
      EXPECT_NE(r.err.find("(pass --force to replace it)"), std::string::npos) << r.err;
      EXPECT_EQ(read_text(target), "appeared\n");
      // Only the file that appeared: the other is not left half-made.
      EXPECT_EQ(names_starting(d, "m.jsonl"),
                std::vector<std::string>{target.substr(target.rfind('/') + 1)});
      std::filesystem::remove(target);
    }
  }
  const RunResult sync = run(with_faults("QTK_FAULT_DIR_FSYNC=1") + merge_cmd(out + files));
  EXPECT_EQ(sync.status, 1) << sync.err;
  EXPECT_EQ(sync.err, fmt::format("merge: {}: the results and their header are in place, but the "
                                  "fsync of directory {} failed: Input/output error; a crash "
                                  "could still undo the move\n",
                                  out, d));
  expect_only_the_merged_pair(d, out);
}

// SIGINT, SIGTERM or SIGHUP while merge writes (here: as its staging file,
// then its header's temporary file, is fsynced) stop it before anything is
// moved into place: it removes those files and OUT.lock, says so in one
// line and ends by the signal; OUT and its header stay as they were. Under
// nohup a SIGHUP does not stop it.
TEST(Shard, MergeStoppedBySignalLeavesNothingBehind) {
  const std::string files = run_shards("msig", 2);
  std::vector<std::string> shard_args;
  for (int k = 1; k >= 0; --k) shard_args.push_back(fmt::format("{}/msig_{}.jsonl", work_dir(), k));
  const std::string d = work_dir() + "/msig";
  std::filesystem::create_directories(d);
  const std::string out = d + "/m.jsonl", err = work_dir() + "/msig.err";
  write_text(out, "old results\n");
  write_text(out + ".meta.json", "{\"old\": true}\n");
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    for (int at : {1, 2}) {
      SCOPED_TRACE(fmt::format("{} at fsync {}", sigabbrev_np(sig), at));
      std::vector<std::string> argv = {QTK_MERGE_BIN, "--force", out};
      argv.insert(argv.end(), shard_args.begin(), shard_args.end());
      const pid_t pid =
          start_with_default_signals(argv, false,
                                     {{"LD_PRELOAD", QTK_FAULT_SHIM},
                                      {"ASAN_OPTIONS", "verify_asan_link_order=0"},
                                      {"QTK_FAULT_SIGNAL_AT_FSYNC", fmt::format("{}:{}", sig, at)}},
                                     "/dev/null", err);
      int st = 0;
      ASSERT_EQ(::waitpid(pid, &st, 0), pid);
      EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "status " << st;
      EXPECT_EQ(read_text(err), fmt::format("merge: {}: interrupted by SIG{} before the results "
                                            "were moved into place; {} and {}.meta.json are as "
                                            "they were\n",
                                            out, sigabbrev_np(sig), out, out));
      EXPECT_EQ(read_text(out), "old results\n");
      EXPECT_EQ(read_text(out + ".meta.json"), "{\"old\": true}\n");
      EXPECT_EQ(names_starting(d, "m.jsonl"),
                (std::vector<std::string>{"m.jsonl", "m.jsonl.meta.json"}));
    }
  }
  std::vector<std::string> argv = {QTK_MERGE_BIN, "--force", out};
  argv.insert(argv.end(), shard_args.begin(), shard_args.end());
  const pid_t pid =
      start_with_default_signals(argv, /*nohup=*/true,
                                 {{"LD_PRELOAD", QTK_FAULT_SHIM},
                                  {"ASAN_OPTIONS", "verify_asan_link_order=0"},
                                  {"QTK_FAULT_SIGNAL_AT_FSYNC", fmt::format("{}:1", SIGHUP)}},
                                 "/dev/null", err);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 3) << "status " << st << ": " << read_text(err);
  EXPECT_EQ(read_text(out), read_text(job().full));
  expect_merged_pair(out);
}

// What a killed merge (or generate) left of its pid-named files beside OUT
// is removed by the next merge into OUT, one line each; a kill between
// merge's two renames is mended by merging again.
TEST(Shard, MergeRemovesWhatAKilledMergeLeft) {
  const std::string files = run_shards("mstale", 2);
  const std::string d = work_dir() + "/mstale";
  std::filesystem::create_directories(d);
  const std::string out = d + "/m.jsonl";
  const RunResult killed =
      run(with_faults("QTK_FAULT_KILL_AT_RENAME_TO=" + out) + merge_cmd(out + files));
  EXPECT_EQ(killed.status, 128 + SIGKILL) << killed.err;
  // The header is in place, the results are not.
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_EQ(load_json(out + ".meta.json").value("status", ""), "complete");
  const auto left = names_starting(d, "m.jsonl.merge.");
  ASSERT_EQ(left.size(), 1u);
  const std::string pid = left[0].substr(std::string("m.jsonl.merge.").size());
  const std::string old_tmp = fmt::format("m.jsonl.merge.{}.tmp.{}", pid, pid);
  const std::string header_tmp = fmt::format("m.jsonl.meta.json.tmp.{}", pid);
  write_text(d + "/" + old_tmp, "an older merge's\n");
  write_text(d + "/" + header_tmp, "{}\n");
  const RunResult again = run(merge_cmd("--force " + out + files));
  EXPECT_EQ(again.status, 3) << again.err;
  for (const std::string& name : {left[0], old_tmp, header_tmp})
    EXPECT_NE(again.err.find(fmt::format("merge: removed stale temporary file {}/{} left by pid "
                                         "{}, which is no longer running\n",
                                         d, name, pid)),
              std::string::npos)
        << again.err;
  expect_only_the_merged_pair(d, out);
}

// A merge that gets SIGINT twice while it cannot reach its next check (here
// blocked writing to stderr, a pipe nobody reads, the line saying it removed
// a stale temporary file) ends at the second signal at once, by that
// signal, with OUT.lock removed and nothing written. (OUT.lock used to be left
// behind: merge's own handlers were installed, and OutputLock put the file
// on the list of files a second signal removes only where it installed
// none.)
TEST(Shard, SecondSignalEndsABlockedMergeAndRemovesItsLock) {
  run_shards("m2sig", 2);
  const std::string d = work_dir() + "/m2sig";
  std::filesystem::create_directories(d);
  const std::string out = d + "/m.jsonl";
  std::vector<std::string> argv = {QTK_MERGE_BIN, out};
  for (int k = 0; k < 2; ++k) argv.push_back(fmt::format("{}/m2sig_{}.jsonl", work_dir(), k));
  const std::string stale = fmt::format("{}.merge.{}", out, dead_pid());
  write_text(stale, "left\n");
  const FullPipe err;
  ASSERT_GE(err.write_fd(), 0);
  const pid_t pid = start_with_default_signals(argv, false, {}, "/dev/null", "", err.write_fd());
  ASSERT_GT(pid, 0);
  // The lock taken and the stale file removed; the line saying so waits.
  int st = 0;
  ASSERT_TRUE(running_until(
      pid, [&] { return !std::filesystem::exists(stale); }, &st, 3000))
      << "merge ended early: status " << st;
  wait_until_blocked(pid);
  ASSERT_EQ(::waitpid(pid, &st, WNOHANG), 0) << "merge ended early: status " << st;
  ASSERT_TRUE(std::filesystem::exists(out + ".lock"));
  // (the write it waits in is restarted: one signal only recorded)
  ASSERT_TRUE(still_running_after(pid, SIGINT, &st))
      << "one signal ended the blocked merge: status " << st;
  ::kill(pid, SIGINT);
  ASSERT_TRUE(ended_within(pid, 20, &st)) << "a second signal did not end the merge at once";
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT) << "status " << st;
  EXPECT_EQ(names_starting(d, "m.jsonl"), std::vector<std::string>{});
}

// An OUT whose derived names would pass the name length limit, and one under
// a parent that is a file, are refused up front, saying so.
TEST(Shard, MergeChecksItsOutputPath) {
  const std::string files = run_shards("mname", 2);
  const std::string d = work_dir() + "/mname";
  std::filesystem::create_directories(d);
  const std::string name = std::string(244, 'm') + ".jsonl";  // 250 bytes
  const RunResult r = run(merge_cmd(d + "/" + name + files));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err.rfind(fmt::format("merge: OUT {}/{}: the name is too long for the files merge "
                                    "writes beside it: {}.merge.",
                                    d, name, name),
                        0),
            0u)
      << r.err;
  EXPECT_NE(r.err.find("over the file system's limit of 255 bytes (expected a name of at most"),
            std::string::npos)
      << r.err;
  write_text(d + "/f.jsonl", "a file\n");
  const RunResult f = run(merge_cmd(d + "/f.jsonl/m.jsonl" + files));
  EXPECT_EQ(f.status, 1) << f.err;
  EXPECT_EQ(f.err, fmt::format("merge: {}/f.jsonl/m.jsonl: cannot write the results: {}/f.jsonl is "
                               "not a directory (it is a regular file)\n",
                               d, d));
  EXPECT_EQ(names_starting(d, ""), std::vector<std::string>{"f.jsonl"});
}

}  // namespace
}  // namespace qtk::rt_test
