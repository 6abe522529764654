// Issue 20: golden files are never lost, mixed or silently wrong. Each test
// names the numbered item of the issue it covers; each fails on the code
// before the fix (which overwrote inputs, replaced results silently, let two
// runs interleave, resumed from another prompts file, ignored unknown
// request fields and exited 0 with failed lines).
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>
#include <thread>

#include <functional>
#include <optional>

#include "core/interrupt.h"
#include "core/mapped_file.h"
#include "core/output_files.h"
#include "runtime/results_file.h"
#include "tests/runtime/output_faults.h"
#include "tests/runtime/test_util.h"
#include "tokenizer/tokenizer.h"

namespace qtk::rt_test {
namespace {

using namespace std::string_literals;

const char* kTiny = "tests/data/models/qwen3-tiny";

std::string prompts(int n, int seed = 0) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    std::vector<int> ids;
    for (int k = 0; k < 3 + (i * 7) % 20; ++k) ids.push_back((seed + i * 31 + k * 17) % 512);
    s += nlohmann::json{{"id", i}, {"prompt_token_ids", ids}, {"max_tokens", 4 + i % 5}}.dump() +
         "\n";
  }
  return s;
}

std::string batch_file(const std::string& name, const std::string& text) {
  const std::string path = work_dir() + "/" + name;
  write_text(path, text);
  return path;
}

// Item 1: an output path that is an input (directly, by a symlink or a hard
// link) is refused before anything is opened for writing.
TEST(GenerateSafety, Item1_OutputThatIsAnInputIsRefused) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("alias.jsonl", prompts(2));
  const std::string pack_bytes = read_text(pack), in_bytes = read_text(in);
  const std::string link = work_dir() + "/alias.link.jsonl";
  const std::string hard = work_dir() + "/alias.hard.pack";
  std::filesystem::create_symlink(in, link);
  std::filesystem::create_hard_link(pack, hard);
  for (const auto& [out, input] : std::vector<std::pair<std::string, std::string>>{
           {pack, "--model"}, {in, "--batch"}, {link, "--batch"}, {hard, "--model"}}) {
    SCOPED_TRACE(out);
    for (const char* flags : {"", "--force", "--resume"}) {
      RunResult r = generate(pack, in, out, flags);
      EXPECT_EQ(r.status, 1) << flags << ": " << r.err;
      EXPECT_NE(r.err.find(input), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("same file"), std::string::npos) << r.err;
    }
    EXPECT_FALSE(std::filesystem::exists(out + ".meta.json"));
  }
  EXPECT_EQ(read_text(pack), pack_bytes);
  EXPECT_EQ(read_text(in), in_bytes);
  // The run header path is an output too.
  const std::string meta_alias = work_dir() + "/meta_alias.jsonl";
  std::filesystem::create_symlink(in, meta_alias + ".meta.json");
  RunResult m = generate(pack, in, meta_alias, "");
  EXPECT_EQ(m.status, 1) << m.err;
  EXPECT_EQ(read_text(in), in_bytes);
}

// The run header's own path (--meta) is checked before the run like --out:
// one of the other outputs, a missing directory, a directory, an input; each
// refused naming --meta, with nothing written.
TEST(GenerateSafety, MetaPathIsCheckedBeforeTheRun) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("meta_check.jsonl", prompts(2));
  const std::string dir = work_dir() + "/meta_check";
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/r.jsonl";
  struct Case {
    std::string meta, says;
  };
  for (const Case& c : std::vector<Case>{{out, "same file as --out"},
                                         {dir + "/./r.jsonl", "same file as --out"},
                                         {out + ".partial", "same file as the partial results"},
                                         {dir + "/missing/m.json", "does not exist"},
                                         {dir, "is a directory"},
                                         {in, "same file"}}) {
    SCOPED_TRACE(c.meta);
    RunResult r = generate(pack, in, out, "--meta " + c.meta);
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_EQ(r.err.rfind("generate: --meta ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                            std::filesystem::directory_iterator{}),
              0)
        << "something was written";
  }
  // A directory at the default header's name (OUT.meta.json) is named as
  // OUT's run header, not as an --out path.
  std::filesystem::create_directory(out + ".meta.json");
  for (const char* flags : {"", "--force"}) {
    const RunResult h = generate(pack, in, out, flags);
    EXPECT_EQ(h.status, 1) << h.err;
    EXPECT_EQ(h.err, fmt::format("generate: {}.meta.json (OUT's run header): is a directory; "
                                 "expected a file name\n",
                                 out));
  }
  std::filesystem::remove(out + ".meta.json");
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  // With the results on stdout too.
  RunResult s = run(fmt::format("{} --model {} --batch {} --out - --meta {}/missing/m.json",
                                QTK_GENERATE_BIN, pack, in, dir));
  EXPECT_EQ(s.status, 1) << s.err;
  EXPECT_NE(s.err.find("does not exist"), std::string::npos) << s.err;
  // An existing file is replaced only with --force (or --resume); a device
  // is never replaced; the chat template is an input like the others.
  const std::string other = work_dir() + "/meta_check_other";
  std::filesystem::create_directories(other);
  const std::string kept = other + "/kept.json", tmpl = other + "/t.jinja";
  write_text(kept, "precious\n");
  write_text(tmpl, "{{ messages[0]['content'] }}");
  for (const std::string& o : {other + "/r.jsonl", std::string("-")}) {
    SCOPED_TRACE(o);
    RunResult e = run(fmt::format("{} --model {} --batch {} --out {} --meta {} --threads 1",
                                  QTK_GENERATE_BIN, pack, in, o, kept));
    EXPECT_EQ(e.status, 1) << e.err;
    EXPECT_NE(e.err.find("--meta " + kept + ": already exists (pass --force"), std::string::npos)
        << e.err;
    EXPECT_EQ(read_text(kept), "precious\n");
  }
  RunResult dev = generate(pack, in, other + "/r.jsonl", "--force --meta /dev/null");
  EXPECT_EQ(dev.status, 1) << dev.err;
  EXPECT_NE(dev.err.find("--meta /dev/null: is a character device"), std::string::npos) << dev.err;
  for (const auto& [o, flags] : std::vector<std::pair<std::string, std::string>>{
           {other + "/r.jsonl", "--force --meta " + tmpl}, {tmpl, "--force"}}) {
    RunResult t = generate(pack, in, o, flags + " --chat-template " + tmpl);
    EXPECT_EQ(t.status, 1) << t.err;
    EXPECT_NE(t.err.find("which is the --chat-template file"), std::string::npos) << t.err;
  }
  EXPECT_EQ(read_text(tmpl), "{{ messages[0]['content'] }}");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(other),
                          std::filesystem::directory_iterator{}),
            2)
      << "something was written";
  RunResult forced = generate(pack, in, other + "/r.jsonl", "--force --meta " + kept);
  EXPECT_EQ(forced.status, 0) << forced.err;
  EXPECT_EQ(load_json(kept).value("status", ""), "complete");
}

// --resume of a complete results file (a repeated command) leaves the file
// and its header as that run wrote them, statistics and settings included,
// whatever scheduling flags the repeat gives.
TEST(GenerateSafety, ResumingACompleteRunLeavesItsHeader) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("complete.jsonl", prompts(3));
  const std::string out = work_dir() + "/complete.out.jsonl";
  ASSERT_EQ(generate(pack, in, out, "--threads 1 --max-num-seqs 2").status, 0);
  const std::string results = read_text(out), header = read_text(out + ".meta.json");
  RunResult r = generate(pack, in, out, "--threads 1 --max-num-seqs 5 --resume");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("is already complete"), std::string::npos) << r.err;
  EXPECT_EQ(read_text(out), results);
  EXPECT_EQ(read_text(out + ".meta.json"), header);
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
}

// A partial results line whose prompt is not the one its input line gives,
// a line with a CRLF end, or an error line where this run gives a result (or
// another error), i.e. the partial file edited, is not resumed over; the
// untouched one is.
TEST(GenerateSafety, ResumeChecksThePromptOfEachDoneLine) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("done_prompt.jsonl", prompts(4));
  const std::string full = work_dir() + "/done_prompt.full.jsonl";
  ASSERT_EQ(generate(pack, in, full, "--threads 1").status, 0);
  const std::string ref = read_text(full);
  const std::string first_two = ref.substr(0, ref.find('\n', ref.find('\n') + 1) + 1);
  auto second = nlohmann::json::parse(first_two.substr(first_two.find('\n') + 1));
  second["prompt_token_ids"][0] = second["prompt_token_ids"][0].get<int>() + 1;
  const std::string out = work_dir() + "/done_prompt.out.jsonl";
  write_killed_run(out, first_two.substr(0, first_two.find('\n') + 1) + second.dump() + "\n",
                   full + ".meta.json");
  RunResult r = generate(pack, in, out, "--threads 1 --resume");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("line 2 records other prompt_token_ids than"), std::string::npos) << r.err;
  // Its lines re-saved with CRLF ends: the final file would not be one run's.
  const size_t end1 = first_two.find('\n');
  const std::string crlf = first_two.substr(0, end1) + "\r" + first_two.substr(end1);
  write_killed_run(out, crlf, full + ".meta.json");
  r = generate(pack, in, out, "--threads 1 --resume");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("line 1 holds a carriage return"), std::string::npos) << r.err;
  // A result edited into an error line (its input line is valid).
  const nlohmann::json made_up = {{"id", second["id"]}, {"error", "made up"}};
  write_killed_run(out, first_two.substr(0, first_two.find('\n') + 1) + made_up.dump() + "\n",
                   full + ".meta.json");
  r = generate(pack, in, out, "--threads 1 --resume");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("line 2 is an error line, but this run gives"), std::string::npos) << r.err;
  // A kept line that is not a result line this run could write: the
  // output's tokens, their end, margins.
  const auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto j = nlohmann::json::parse(first_two.substr(first_two.find('\n') + 1));
    edit(j);
    return first_two.substr(0, first_two.find('\n') + 1) + j.dump() + "\n";
  };
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> bad_lines = {
      {[](nlohmann::json& j) { j.erase("output_token_ids"); },
       "field 'output_token_ids': expected an array"},
      {[](nlohmann::json& j) { j["output_token_ids"][0] = 512; },
       "field 'output_token_ids': expected token ids below 512, found 512 at index 0"},
      {[](nlohmann::json& j) { j["output_token_ids"].push_back(1); },
       "field 'output_token_ids': 6 tokens, past the request's max_tokens 5"},
      {[](nlohmann::json& j) { j.erase("finish_reason"); },
       "field 'finish_reason': expected \"stop\" or \"length\""},
      {[](nlohmann::json& j) { j["finish_reason"] = "stop"; },
       "field 'finish_reason': \"stop\" does not match the last token"},
      {[](nlohmann::json& j) { j["top1_margin"] = {1.0}; }, "field 'top1_margin': present where"},
  };
  for (const auto& [edit, needle] : bad_lines) {
    write_killed_run(out, edited(edit), full + ".meta.json");
    r = generate(pack, in, out, "--threads 1 --resume");
    EXPECT_EQ(r.status, 1) << needle << ": " << r.err;
    EXPECT_NE(r.err.find("line 2 (id " + second["id"].dump() + ", " + in +
                         " line 2) is not a result line of generate: " + needle),
              std::string::npos)
        << r.err;
  }
  write_killed_run(out, first_two, full + ".meta.json");
  r = generate(pack, in, out, "--threads 1 --resume");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_text(out), ref);

  // An input line that fails keeps its error line across a resume; the same
  // error with other words (another build's) is not carried over.
  std::string bad_text = prompts(2);
  bad_text.insert(0, "not json\n");
  const std::string bad_in = batch_file("done_error.jsonl", bad_text);
  const std::string bad_full = work_dir() + "/done_error.full.jsonl";
  ASSERT_EQ(generate(pack, bad_in, bad_full, "--threads 1").status, 3);
  const std::string bad_ref = read_text(bad_full);
  const std::string bad_first = bad_ref.substr(0, bad_ref.find('\n') + 1);
  const std::string bad_out = work_dir() + "/done_error.out.jsonl";
  auto reworded = nlohmann::json::parse(bad_first);
  reworded["error"] = "malformed JSON: " + reworded["error"].get<std::string>();
  write_killed_run(bad_out, reworded.dump() + "\n", bad_full + ".meta.json");
  r = generate(pack, bad_in, bad_out, "--threads 1 --resume");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("line 1 is an error line, but this run gives"), std::string::npos) << r.err;
  write_killed_run(bad_out, bad_first, bad_full + ".meta.json");
  r = generate(pack, bad_in, bad_out, "--threads 1 --resume");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(read_text(bad_out), bad_ref);
}

// An explicit --kv-cache-blocks bigger than the memory there is is refused
// up front with the sizes, nothing written (it used to allocate and zero
// until the machine swapped).
TEST(GenerateSafety, KvCacheBeyondMemoryIsRefused) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("kv_huge.jsonl", prompts(2));
  const std::string out = work_dir() + "/kv_huge.out.jsonl";
  RunResult r = generate(pack, in, out, "--threads 1 --block-size 16384 --kv-cache-blocks 1000000");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("--kv-cache-blocks 1000000: 1000000 blocks of 16384 tokens need"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("GiB of memory available"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
}

// Item 2: an existing --out is refused without --force or --resume; a failed
// --force run leaves the previous results and header untouched.
TEST(GenerateSafety, Item2_ExistingOutputNeedsForceAndSurvivesAFailedRun) {
  const std::string pack = pack_of(kTiny);
  const std::string a = batch_file("exist.a.jsonl", prompts(3, 0));
  const std::string b = batch_file("exist.b.jsonl", prompts(3, 7));
  const std::string out = work_dir() + "/exist.results.jsonl";
  ASSERT_EQ(generate(pack, a, out, "").status, 0);
  const std::string first = read_text(out), first_meta = read_text(out + ".meta.json");

  RunResult again = generate(pack, b, out, "");
  EXPECT_EQ(again.status, 1) << again.err;
  EXPECT_NE(again.err.find("already exists"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("--force"), std::string::npos) << again.err;
  EXPECT_EQ(read_text(out), first);
  EXPECT_EQ(read_text(out + ".meta.json"), first_meta);

  // A --force run that fails half-way (a 4 KB file-size limit; its header
  // fits, its results do not) keeps the old file and header.
  const std::string big = batch_file("exist.big.jsonl", prompts(100, 3));
  RunResult full =
      run(fmt::format("ulimit -f 8; {} --model {} --batch {} --out {} --force --margins",
                      QTK_GENERATE_BIN, pack, big, out));
  EXPECT_EQ(full.status, 1) << full.err;
  EXPECT_EQ(read_text(out), first) << "a failed --force run changed the previous results";
  EXPECT_EQ(read_text(out + ".meta.json"), first_meta);
  ASSERT_TRUE(std::filesystem::exists(out + ".partial.meta.json"));
  EXPECT_EQ(load_json(out + ".partial.meta.json")["status"], "failed");

  // A header left without its results is kept too, unless --force.
  const std::string lone = work_dir() + "/exist.lone.jsonl";
  write_text(lone + ".meta.json", first_meta);
  RunResult orphan = generate(pack, a, lone, "");
  EXPECT_EQ(orphan.status, 1) << orphan.err;
  EXPECT_NE(orphan.err.find("its run header " + lone + ".meta.json exists already"),
            std::string::npos)
      << orphan.err;
  EXPECT_EQ(read_text(lone + ".meta.json"), first_meta);
  EXPECT_FALSE(std::filesystem::exists(lone));
  ASSERT_EQ(generate(pack, a, lone, "--force").status, 0);
  EXPECT_EQ(read_text(lone), first);

  // Then without a flag: the partial results are named, not overwritten.
  RunResult named = generate(pack, big, out, "--margins");
  EXPECT_EQ(named.status, 1);
  EXPECT_NE(named.err.find(".partial"), std::string::npos) << named.err;

  // --force replaces it once the new run completes; nothing else is left.
  ASSERT_EQ(generate(pack, b, out, "--force").status, 0);
  EXPECT_NE(read_text(out), first);
  EXPECT_EQ(load_json(out + ".meta.json")["status"], "complete");
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
  EXPECT_FALSE(std::filesystem::exists(out + ".partial.meta.json"));
  EXPECT_FALSE(std::filesystem::exists(out + ".lock"));
}

// Item 3: a second generate on the same --out exits 1 naming the holder.
// note: the test process holds the lock itself (as a first generate would),
// so the outcome does not depend on timing two runs.
TEST(GenerateSafety, Item3_SecondWriterIsRefusedNamingTheHolder) {
  const std::string pack = pack_of(kTiny);
  const std::string in = batch_file("lock.jsonl", prompts(2));
  const std::string out = work_dir() + "/lock.results.jsonl";
  const int fd = ::open((out + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const std::string pid = std::to_string(::getpid());
  ASSERT_EQ(::write(fd, pid.data(), pid.size()), static_cast<ssize_t>(pid.size()));
  RunResult r = generate(pack, in, out, "--force");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("pid " + pid), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
  ::close(fd);  // the holder is gone: the next run proceeds
  RunResult ok = generate(pack, in, out, "");
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_FALSE(std::filesystem::exists(out + ".lock"));
}

// Flips one byte of a STORED zip entry's data, found through its local header.
void flip_byte_in_entry(const std::string& zip, const std::string& entry, size_t offset) {
  std::string bytes = read_text(zip);
  const size_t name_at = bytes.find(entry);
  ASSERT_NE(name_at, std::string::npos);
  const size_t header = name_at - 30;
  ASSERT_EQ(bytes.compare(header, 4, "PK\x03\x04"), 0);
  auto u16 = [&](size_t at) {
    return static_cast<size_t>(static_cast<unsigned char>(bytes[at])) |
           static_cast<size_t>(static_cast<unsigned char>(bytes[at + 1])) << 8;
  };
  const size_t data = name_at + u16(header + 26) + u16(header + 28);
  bytes[data + offset] = static_cast<char>(bytes[data + offset] ^ 0x5a);
  write_text(zip, bytes);
}

// Item 6: every tensor's checksum is verified at load unless --no-verify,
// and the choice is recorded in the run header.
TEST(GenerateSafety, Item6_CorruptTensorIsRefusedAtLoad) {
  const std::string pack = pack_of(kTiny);
  const std::string bad = work_dir() + "/corrupt.pack";
  std::filesystem::copy_file(pack, bad);
  flip_byte_in_entry(bad, "tensors/layers.0.self_attn.o_proj", 100);
  const std::string in = batch_file("verify.jsonl", prompts(2));
  const std::string out = work_dir() + "/verify.results.jsonl";
  RunResult r = generate(bad, in, out, "");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("layers.0.self_attn.o_proj"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("checksum"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".partial.meta.json"));

  RunResult skip = generate(bad, in, out, "--no-verify");
  EXPECT_EQ(skip.status, 0) << skip.err;
  EXPECT_EQ(load_json(out + ".meta.json")["settings"]["verify_checksums"], false);
  const std::string clean = work_dir() + "/verify.clean.jsonl";
  ASSERT_EQ(generate(pack, in, clean, "").status, 0);
  EXPECT_EQ(load_json(clean + ".meta.json")["settings"]["verify_checksums"], true);
}

// Item 7: --resume refuses a different prompts file with the same ids.
TEST(GenerateSafety, Item7_ResumeRefusesAnotherPromptsFile) {
  const std::string pack = pack_of(kTiny);
  const std::string text = prompts(6);
  const std::string in = batch_file("digest.jsonl", text);
  const std::string full = work_dir() + "/digest.full.jsonl";
  ASSERT_EQ(generate(pack, in, full, "").status, 0);
  const std::string expected = read_text(full);
  const std::string part = work_dir() + "/digest.part.jsonl";
  write_text(part, expected.substr(0, expected.find('\n') + 1));
  // note: as an older qtk left it, without the results' digest.
  auto header = load_json(full + ".meta.json");
  header.erase("results_xxh64");
  write_text(part + ".meta.json", header.dump(2));
  // Line 3 changed, ids kept (default line-number ids would behave the same).
  auto lines = read_jsonl(in);
  lines[2]["prompt_token_ids"][0] = 99;
  std::string changed;
  for (const auto& l : lines) changed += l.dump() + "\n";
  const std::string other = batch_file("digest.other.jsonl", changed);
  RunResult r = generate(pack, other, part, "--resume");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("line 3"), std::string::npos) << r.err;
  // One line more is another file too.
  const std::string longer = batch_file("digest.longer.jsonl", text + prompts(1, 5));
  RunResult l = generate(pack, longer, part, "--resume");
  EXPECT_EQ(l.status, 1) << l.err;
  EXPECT_EQ(read_text(part), expected.substr(0, expected.find('\n') + 1));
  // The same file resumes to the uninterrupted result; its progress counts
  // the line already done.
  const RunResult ok = generate(pack, in, part, "--resume --progress");
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(read_text(part), expected);
  EXPECT_NE(ok.err.find("generate: 6/6 done"), std::string::npos) << ok.err;
  EXPECT_EQ(ok.err.find("/5 done"), std::string::npos) << ok.err;
}

// Item 8: max_new_tokens is max_tokens; an unknown field is a per-line error
// naming it unless --allow-unknown-fields (recorded in the run header).
TEST(GenerateSafety, Item8_RequestFieldContract) {
  const std::string pack = pack_of(kTiny);
  const std::string in = batch_file(
      "fields.jsonl",
      "{\"id\": \"mnt\", \"prompt_token_ids\": [1, 2], \"max_new_tokens\": 2}\n"
      "{\"id\": \"same\", \"prompt_token_ids\": [1, 2], \"max_tokens\": 3, \"max_new_tokens\": 3}\n"
      "{\"id\": \"differ\", \"prompt_token_ids\": [1, 2], \"max_tokens\": 3, \"max_new_tokens\": "
      "4}\n"
      "{\"id\": \"temp\", \"prompt_token_ids\": [1, 2], \"max_tokens\": 2, \"temperature\": 0.7}\n"
      "{\"id\": \"chat\", \"prompt_token_ids\": [1, 2], \"max_tokens\": 2, \"enable_thinking\": "
      "false, \"chat_template_kwargs\": {}}\n");
  const std::string out = work_dir() + "/fields.results.jsonl";
  RunResult r = generate(pack, in, out, "--ignore-eos");
  EXPECT_EQ(r.status, 3) << r.err;
  auto res = read_jsonl(out);
  ASSERT_EQ(res.size(), 5u);
  EXPECT_EQ(res[0]["output_token_ids"].size(), 2u) << res[0];
  EXPECT_EQ(res[1]["output_token_ids"].size(), 3u) << res[1];
  ASSERT_TRUE(res[2].contains("error")) << res[2];
  EXPECT_NE(res[2]["error"].get<std::string>().find("max_new_tokens"), std::string::npos);
  ASSERT_TRUE(res[3].contains("error")) << res[3];
  EXPECT_NE(res[3]["error"].get<std::string>().find("'temperature'"), std::string::npos) << res[3];
  // A chat field on a line without 'messages' would be ignored: an error too.
  ASSERT_TRUE(res[4].contains("error")) << res[4];
  EXPECT_NE(res[4]["error"].get<std::string>().find(
                "field 'chat_template_kwargs' is for chat requests ('messages')"),
            std::string::npos)
      << res[4];
  EXPECT_EQ(load_json(out + ".meta.json")["settings"]["allow_unknown_fields"], false);

  const std::string out2 = work_dir() + "/fields.allowed.jsonl";
  RunResult a = generate(pack, in, out2, "--ignore-eos --allow-unknown-fields");
  EXPECT_EQ(a.status, 3) << a.err;  // "differ" still fails
  res = read_jsonl(out2);
  EXPECT_EQ(res[3]["output_token_ids"].size(), 2u) << res[3];
  EXPECT_EQ(res[4]["output_token_ids"].size(), 2u) << res[4];
  const auto meta = load_json(out2 + ".meta.json");
  EXPECT_EQ(meta["settings"]["allow_unknown_fields"], true);
  EXPECT_EQ(meta["unknown_fields_ignored"],
            nlohmann::json({"chat_template_kwargs", "enable_thinking", "temperature"}));
}

// Item 9: exit 3 and a one-line summary when lines failed, even all of them;
// an empty prompts file is refused; compare of two empty files is not OK.
TEST(GenerateSafety, Item9_FailedLinesAreNotExitZero) {
  const std::string pack = pack_of(kTiny);
  const std::string binary =
      batch_file("binary.jsonl", "\x1f\x8b\x08\x00\xff\x01"s + "\n\x01\x02\x03\n");
  const std::string out = work_dir() + "/binary.results.jsonl";
  RunResult r = generate(pack, binary, out, "");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_NE(r.err.find("2 lines: 0 ok, 2 failed"), std::string::npos) << r.err;

  const std::string empty = batch_file("empty.jsonl", "");
  RunResult e = generate(pack, empty, work_dir() + "/empty.results.jsonl", "");
  EXPECT_EQ(e.status, 1) << e.err;
  EXPECT_NE(e.err.find("empty"), std::string::npos) << e.err;
  EXPECT_FALSE(std::filesystem::exists(work_dir() + "/empty.results.jsonl"));
  // Blank lines only, and a directory as the prompts file: refused the same way.
  const std::string blank = batch_file("blank.jsonl", "\n  \n\t\n");
  RunResult b = generate(pack, blank, work_dir() + "/blank.results.jsonl", "");
  EXPECT_EQ(b.status, 1) << b.err;
  EXPECT_NE(b.err.find("found 3 blank lines"), std::string::npos) << b.err;
  EXPECT_FALSE(std::filesystem::exists(work_dir() + "/blank.results.jsonl"));
  RunResult d = generate(pack, work_dir(), work_dir() + "/dir.results.jsonl", "");
  EXPECT_EQ(d.status, 1) << d.err;
  EXPECT_NE(d.err.find("is a directory; expected the batch file"), std::string::npos) << d.err;

  RunResult c = run(fmt::format("{} {} {}", QTK_COMPARE_BIN, empty, empty));
  EXPECT_EQ(c.status, 1) << c.out << c.err;
  EXPECT_EQ(c.out.find("OK"), std::string::npos) << c.out;

  // Success: exit 0 and the summary.
  const std::string good = batch_file("good.jsonl", prompts(2));
  RunResult g = generate(pack, good, work_dir() + "/good.results.jsonl", "");
  EXPECT_EQ(g.status, 0) << g.err;
  EXPECT_NE(g.err.find("2 lines: 2 ok, 0 failed"), std::string::npos) << g.err;
}

// Item 10: --max-tokens INT64_MAX must not overflow the cache sizing (it
// made the context length 2: long prompts were refused, short ones stopped
// after one token).
TEST(GenerateSafety, Item10_HugeMaxTokensRunsToTheContextEnd) {
  const std::string pack = pack_of(kTiny);
  std::vector<int> ids(4000, 7);
  const std::string in = batch_file(
      "huge.jsonl",
      nlohmann::json{{"id", "long"}, {"prompt_token_ids", ids}}.dump() + "\n" +
          nlohmann::json{{"id", "short"}, {"prompt_token_ids", {1}}, {"max_tokens", 3}}.dump() +
          "\n");
  const std::string out = work_dir() + "/huge.results.jsonl";
  RunResult r = generate(pack, in, out, "--ignore-eos --max-tokens 9223372036854775807");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto res = read_jsonl(out);
  ASSERT_EQ(res.size(), 2u);
  ASSERT_FALSE(res[0].contains("error")) << res[0];
  EXPECT_EQ(res[0]["output_token_ids"].size(), 4096u - 4000u) << res[0]["finish_reason"];
  EXPECT_EQ(res[1]["output_token_ids"].size(), 3u);
}

// Item 13: a raw NUL byte after a JSON object is an error, not a hidden tail.
TEST(GenerateSafety, Item13_RawNulIsRejected) {
  const std::string pack = pack_of(kTiny);
  const std::string in =
      batch_file("nul.jsonl", "{\"prompt_token_ids\": [1, 2], \"max_tokens\": 1}\0{\"x\": 1}\n"s +
                                  "{\"prompt_token_ids\": [3], \"max_tokens\": 1}\n");
  const std::string out = work_dir() + "/nul.results.jsonl";
  RunResult r = generate(pack, in, out, "");
  EXPECT_EQ(r.status, 3) << r.err;
  const auto res = read_jsonl(out);
  ASSERT_EQ(res.size(), 2u);
  ASSERT_TRUE(res[0].contains("error")) << res[0];
  EXPECT_NE(res[0]["error"].get<std::string>().find("NUL"), std::string::npos) << res[0];
  EXPECT_FALSE(res[1].contains("error")) << res[1];
}

// Item 14: `-` reads the prompts from stdin and writes the results to
// stdout; the run header then goes to --meta PATH, or nowhere.
TEST(GenerateSafety, Item14_StdinAndStdout) {
  const std::string pack = pack_of(kTiny);
  const std::string in = batch_file("stdio.jsonl", prompts(3));
  const std::string file_out = work_dir() + "/stdio.file.jsonl";
  ASSERT_EQ(generate(pack, in, file_out, "").status, 0);
  const std::string expected = read_text(file_out);

  const std::string from_stdin = work_dir() + "/stdio.stdin.jsonl";
  RunResult a = run(
      fmt::format("{} --model {} --batch - --out {} < {}", QTK_GENERATE_BIN, pack, from_stdin, in));
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(read_text(from_stdin), expected);
  EXPECT_EQ(load_json(from_stdin + ".meta.json")["batch"], "-");

  const std::string meta = work_dir() + "/stdio.header.json";
  RunResult b = run(
      fmt::format("{} --model {} --batch {} --out - --meta {}", QTK_GENERATE_BIN, pack, in, meta));
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(b.out, expected);
  EXPECT_EQ(load_json(meta)["status"], "complete");
  EXPECT_FALSE(std::filesystem::exists("-"));
  EXPECT_FALSE(std::filesystem::exists("-.meta.json"));
  // The header is there now: refused, naming only --force (results on
  // stdout cannot be resumed, so --resume is not offered).
  RunResult again = run(
      fmt::format("{} --model {} --batch {} --out - --meta {}", QTK_GENERATE_BIN, pack, in, meta));
  EXPECT_EQ(again.status, 1);
  EXPECT_EQ(again.err, fmt::format("generate: --meta {}: already exists (pass --force to replace "
                                   "it)\n",
                                   meta));
  EXPECT_TRUE(again.out.empty());

  RunResult c =
      run(fmt::format("{} --model {} --batch - --out - < {}", QTK_GENERATE_BIN, pack, in));
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(c.out, expected);

  RunResult r =
      run(fmt::format("{} --model {} --batch {} --out - --resume", QTK_GENERATE_BIN, pack, in));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--resume"), std::string::npos) << r.err;

  // Results on stdout have no file: a file named "-" in the working
  // directory is neither refused as an existing OUT nor locked or touched.
  const std::string dash_dir = work_dir() + "/stdio-dash";
  std::filesystem::create_directories(dash_dir);
  write_text(dash_dir + "/-", "someone else's file\n");
  RunResult d = run(fmt::format("cd {} && {} --model {} --batch {} --out -", dash_dir,
                                QTK_GENERATE_BIN, pack, in));
  ASSERT_EQ(d.status, 0) << d.err;
  EXPECT_EQ(d.out, expected);
  EXPECT_EQ(read_text(dash_dir + "/-"), "someone else's file\n");
  EXPECT_FALSE(std::filesystem::exists(dash_dir + "/-.lock"));
  // --meta - is refused (the header never goes to stdout), writing nothing.
  RunResult m = run(fmt::format("cd {} && {} --model {} --batch {} --out {}/dash.jsonl --meta -",
                                dash_dir, QTK_GENERATE_BIN, pack, in, dash_dir));
  EXPECT_EQ(m.status, 1) << m.err;
  EXPECT_NE(m.err.find("--meta -: expected a file for the run header"), std::string::npos) << m.err;
  EXPECT_FALSE(std::filesystem::exists(dash_dir + "/dash.jsonl"));
  EXPECT_EQ(read_text(dash_dir + "/-"), "someone else's file\n");
}

// Item 15: one summary line at the end of every run; --progress counts
// tokens (the ETA comes from them).
TEST(GenerateSafety, Item15_SummaryAndTokenProgress) {
  const std::string pack = pack_of(kTiny);
  const std::string in = batch_file("summary.jsonl", prompts(4) + "{\"prompt_token_ids\": []}\n");
  RunResult r =
      generate(pack, in, work_dir() + "/summary.results.jsonl", "--ignore-eos --progress");
  EXPECT_EQ(r.status, 3) << r.err;
  // The last stderr line is the summary.
  const std::string last = r.err.substr(r.err.rfind('\n', r.err.size() - 2) + 1);
  EXPECT_EQ(last.rfind("generate: 5 lines: 4 ok, 1 failed; ", 0), 0u) << r.err;
  EXPECT_NE(last.find("generated tokens in"), std::string::npos) << last;
  EXPECT_NE(last.find("tok/s"), std::string::npos) << last;
  EXPECT_NE(last.find("wall time"), std::string::npos) << last;
  // prompts(4): budgets 4..7 tokens, all generated with --ignore-eos.
  int64_t prompt_tokens = 0;
  for (const auto& l : read_jsonl(in))
    prompt_tokens += l.contains("max_tokens") ? l["prompt_token_ids"].size() : 0;
  const int64_t work = prompt_tokens + 4 + 5 + 6 + 7;
  EXPECT_NE(r.err.find(fmt::format("{}/{} tokens", work, work)), std::string::npos) << r.err;
}

// Item 16: --logprobs K gives the K most likely (id, logprob) per step, from
// the same logits as the greedy choice, bit-identical however scheduled.
TEST(GenerateSafety, Item16_LogprobsAreScheduleInvariant) {
  const std::string pack = pack_of(kTiny);
  const std::string in = batch_file("logprobs.jsonl", prompts(12));
  const std::string alone = work_dir() + "/logprobs.alone.jsonl";
  const std::string mixed = work_dir() + "/logprobs.mixed.jsonl";
  ASSERT_EQ(generate(pack, in, alone, "--logprobs 5 --margins --max-num-seqs 1 --threads 1").status,
            0);
  ASSERT_EQ(generate(pack, in, mixed,
                     "--logprobs 5 --margins --max-batched-tokens 7 --threads 2 --block-size 4")
                .status,
            0);
  EXPECT_EQ(read_text(alone), read_text(mixed));
  for (const auto& r : read_jsonl(alone)) {
    ASSERT_EQ(r["logprobs"].size(), r["output_token_ids"].size()) << r;
    for (size_t step = 0; step < r["logprobs"].size(); ++step) {
      const auto& top = r["logprobs"][step];
      ASSERT_EQ(top.size(), 5u);
      EXPECT_EQ(top[0][0], r["output_token_ids"][step]) << "top-1 is the greedy token";
      double mass = 0.0;
      for (size_t j = 0; j < top.size(); ++j) {
        const double lp = top[j][1].get<double>();
        EXPECT_LE(lp, 0.0);
        if (j > 0) {
          EXPECT_LE(lp, top[j - 1][1].get<double>());
        }
        mass += std::exp(lp);
      }
      EXPECT_LE(mass, 1.0 + 1e-5);
      // logprob(top1) - logprob(top2) is the margin, up to float rounding.
      EXPECT_NEAR(top[0][1].get<double>() - top[1][1].get<double>(),
                  r["top1_margin"][step].get<double>(), 1e-4);
    }
  }
  EXPECT_EQ(load_json(alone + ".meta.json")["settings"]["logprobs"], 5);
  RunResult bad = generate(pack, in, work_dir() + "/logprobs.bad.jsonl", "--logprobs 21");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--logprobs"), std::string::npos) << bad.err;
}

// Item 17: output_text is the decode of every output token, a final stop
// token included, like output_token_ids.
TEST(GenerateSafety, Item17_OutputTextIncludesTheStopToken) {
  const std::string pack = pack_of("samples/qwen3-sample");
  ASSERT_FALSE(pack.empty());
  const std::string in =
      batch_file("stoptext.jsonl", "{\"id\": \"x\", \"prompt\": \"def add(a, b):\\n\"}\n");
  const std::string free_run = work_dir() + "/stoptext.free.jsonl";
  ASSERT_EQ(generate(pack, in, free_run, "--max-tokens 8 --ignore-eos").status, 0);
  const auto ids = read_jsonl(free_run).at(0)["output_token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 8u);
  // Stop at the token generated at step 4 (its first occurrence).
  const int32_t stop = ids[3];
  const size_t first = static_cast<size_t>(std::find(ids.begin(), ids.end(), stop) - ids.begin());
  write_text(in,
             nlohmann::json{{"id", "x"}, {"prompt", "def add(a, b):\n"}, {"stop_token_ids", {stop}}}
                     .dump() +
                 "\n");
  const std::string out = work_dir() + "/stoptext.jsonl.out";
  ASSERT_EQ(generate(pack, in, out, "--max-tokens 8 --ignore-eos").status, 0);
  const auto res = read_jsonl(out).at(0);
  ASSERT_EQ(res["finish_reason"], "stop") << res;
  const auto got = res["output_token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(got.size(), first + 1);
  const Tokenizer tok = Tokenizer::from_json_text(
      read_text(src("samples/qwen3-sample/tokenizer.json")), "tokenizer.json");
  const std::string stop_text = tok.decode(std::vector<int32_t>{stop});
  ASSERT_FALSE(stop_text.empty());
  EXPECT_EQ(res["output_text"], tok.decode(got)) << res;
}

// Item 18: messages name what the user gave, never a temporary file, and say
// what a checkpoint directory or a GGUF file is.
TEST(GenerateSafety, Item18_MessagesNameWhatTheUserGave) {
  const std::string in = batch_file("msg.jsonl", prompts(1));
  RunResult dir = generate(src(kTiny), in, work_dir() + "/msg.dir.jsonl", "");
  EXPECT_EQ(dir.status, 1);
  EXPECT_NE(dir.err.find("this is a checkpoint directory"), std::string::npos) << dir.err;
  EXPECT_NE(dir.err.find("run convert first"), std::string::npos) << dir.err;
  const std::string gguf = work_dir() + "/model.gguf";
  write_text(gguf, "GGUF\x03\x00\x00\x00" + std::string(4096, '\0'));
  RunResult g = generate(gguf, in, work_dir() + "/msg.gguf.jsonl", "");
  EXPECT_EQ(g.status, 1);
  EXPECT_NE(g.err.find("this looks like a GGUF file"), std::string::npos) << g.err;
  // A run header that cannot be written (a 512-byte file-size limit): the
  // message names no temporary file.
  const std::string pack = pack_of(kTiny);
  const std::string out = work_dir() + "/msg.full.jsonl";
  RunResult f = run(fmt::format("ulimit -f 1; {} --model {} --batch {} --out {}", QTK_GENERATE_BIN,
                                pack, in, out));
  EXPECT_EQ(f.status, 1) << f.err;
  EXPECT_NE(f.err.find("msg.full.jsonl"), std::string::npos) << f.err;
  EXPECT_EQ(f.err.find(".tmp"), std::string::npos) << f.err;
}

// The text of a batch of `lines` requests (ids 0 on, three-token prompts),
// `max_tokens` each.
std::string long_batch_text(size_t lines, int max_tokens) {
  std::string text;
  for (size_t i = 0; i < lines; ++i)
    text +=
        nlohmann::json{
            {"id", i}, {"prompt_token_ids", {1 + i % 500, 2, 3}}, {"max_tokens", max_tokens}}
            .dump() +
        "\n";
  return text;
}

// A run stopped by SIGTERM, SIGINT or SIGHUP removes its lock file (a
// SIGKILL cannot), ends by that signal, keeps its partial results for
// --resume, and its header says "interrupted"; under nohup a SIGHUP does
// not stop it.
TEST(GenerateSafety, SignalledRunRemovesItsLockFile) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  // Long enough to be stopped mid-run (seconds): one sequence at a time.
  constexpr size_t kLines = 2000;
  const std::string text = long_batch_text(kLines, 32);
  const std::string in = batch_file("signal.jsonl", text);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    SCOPED_TRACE(sigabbrev_np(sig));
    const std::string out = fmt::format("{}/signal.{}.jsonl", work_dir(), sig);
    const pid_t pid = start_with_default_signals({QTK_GENERATE_BIN, "--model", pack, "--batch", in,
                                                  "--out", out, "--ignore-eos", "--threads", "1",
                                                  "--max-num-seqs", "1", "--no-progress"});
    ASSERT_GT(pid, 0);
    // Wait for the first results, so that the lock is held and the run is under way.
    int st = 0;
    ASSERT_TRUE(wait_for_lines(out + ".partial", 2, pid, &st))
        << "generate ended before it could be stopped (status " << st << ")";
    ASSERT_TRUE(std::filesystem::exists(out + ".lock"));
    ::kill(pid, sig);
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "status " << st;
    EXPECT_FALSE(std::filesystem::exists(out + ".lock")) << "the lock file was left behind";
    // The partial results are as a kill leaves them: complete lines only.
    const std::string partial = read_text(out + ".partial");
    ASSERT_FALSE(partial.empty());
    EXPECT_EQ(partial.back(), '\n');
    EXPECT_LT(complete_lines(out + ".partial"), kLines);
    EXPECT_FALSE(std::filesystem::exists(out));
    // The header of the partial results says the run was interrupted, by
    // what, after how many lines, and how to finish it.
    const nlohmann::json meta = load_json(out + ".partial.meta.json");
    EXPECT_EQ(meta.value("status", ""), "interrupted") << meta.dump(2);
    const std::string error = meta.value("error", "");
    EXPECT_NE(error.find(fmt::format("interrupted by SIG{} after {} of {} lines", sigabbrev_np(sig),
                                     complete_lines(out + ".partial"), kLines)),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("--resume finishes the run"), std::string::npos) << error;
    // Its statistics so far, counts as the partial file holds them.
    const auto tokens_in = [](const std::string& path, const char* field) {
      int64_t n = 0;
      for (const auto& j : read_jsonl(path)) n += static_cast<int64_t>(j[field].size());
      return n;
    };
    ASSERT_TRUE(meta.contains("stats")) << meta.dump(2);
    EXPECT_EQ(meta["stats"]["lines"], complete_lines(out + ".partial"));
    EXPECT_EQ(meta["stats"]["generated_tokens"], tokens_in(out + ".partial", "output_token_ids"));
    // A rerun takes over and finishes the results; its header keeps the
    // interrupted one's, and its counts are the whole file's.
    const RunResult again =
        generate(pack, in, out, "--ignore-eos --threads 1 --max-num-seqs 1 --resume");
    ASSERT_EQ(again.status, 0) << again.err;
    EXPECT_EQ(complete_lines(out), kLines);
    const nlohmann::json done = load_json(out + ".meta.json");
    ASSERT_EQ(done["resumed_from"].size(), 1u) << done.dump(2);
    EXPECT_EQ(done["resumed_from"][0]["status"], "interrupted");
    EXPECT_EQ(done["resumed_from"][0]["stats"], meta["stats"]);
    EXPECT_EQ(done["stats"]["generated_tokens"], tokens_in(out, "output_token_ids"));
    EXPECT_EQ(done["stats"]["prompt_tokens"], tokens_in(out, "prompt_token_ids"));
    EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
    EXPECT_FALSE(std::filesystem::exists(out + ".lock"));
  }
  // Under nohup (SIGHUP ignored) a hang-up does not stop the run.
  const std::string out = work_dir() + "/signal.nohup.jsonl";
  size_t cut = 0;
  for (size_t i = 0; i < kLines / 10; ++i) cut = text.find('\n', cut) + 1;
  const std::string small = batch_file("signal_nohup.jsonl", text.substr(0, cut));
  const pid_t pid = start_with_default_signals(
      {QTK_GENERATE_BIN, "--model", pack, "--batch", small, "--out", out, "--ignore-eos",
       "--threads", "1", "--max-num-seqs", "1", "--no-progress"},
      /*nohup=*/true);
  ASSERT_GT(pid, 0);
  for (int i = 0; i < 6000 && complete_lines(out + ".partial") < 2 && !std::filesystem::exists(out);
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::kill(pid, SIGHUP);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  EXPECT_EQ(complete_lines(out), kLines / 10);
}

// Starts `argv` with SIGINT, SIGTERM and SIGHUP at their default
// dispositions, stdin from `stdin_fd` (-1: /dev/null), stdout to /dev/null,
// stderr to `err_path`, and `env` (NAME=VALUE) added to the environment.
pid_t start_program(const std::vector<std::string>& argv, int stdin_fd, const std::string& err_path,
                    const std::vector<std::string>& env = {}) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGHUP, SIG_DFL);
  for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
  const int in = stdin_fd >= 0 ? stdin_fd : ::open("/dev/null", O_RDONLY);
  const int null = ::open("/dev/null", O_WRONLY);
  const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(in, 0), ::dup2(null, 1), ::dup2(err, 2);
  ::execv(args[0], args.data());
  ::_exit(127);
}

// A SIGINT, SIGTERM or SIGHUP stops a run that waits for its prompts (stdin
// a pipe nobody writes to, or a FIFO nobody opened for writing) at once:
// one line naming the signal, the lock file removed, nothing written, and
// the process ends by that signal. (It used to wait for input or a second
// signal, which left the lock behind.)
TEST(GenerateSafety, SignalStopsARunWaitingForItsPrompts) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    for (const bool fifo : {false, true}) {
      SCOPED_TRACE(fmt::format("SIG{}, {}", sigabbrev_np(sig), fifo ? "a FIFO" : "stdin"));
      const std::string out =
          fmt::format("{}/waiting.{}.{}.jsonl", work_dir(), sig, fifo ? "fifo" : "stdin");
      const std::string fifo_path = out + ".in";
      int pipe_fds[2] = {-1, -1};
      if (fifo)
        ASSERT_EQ(::mkfifo(fifo_path.c_str(), 0644), 0);
      else
        ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
      const pid_t pid = start_program({QTK_GENERATE_BIN, "--model", pack, "--batch",
                                       fifo ? fifo_path : "-", "--out", out, "--no-progress"},
                                      pipe_fds[0], out + ".err");
      ASSERT_GT(pid, 0);
      if (!fifo) ::close(pipe_fds[0]);
      // The lock is taken before the model loads; then the run waits for
      // its prompts (the main thread blocked in one system call).
      for (int i = 0; i < 3000 && !std::filesystem::exists(out + ".lock"); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      wait_until_blocked(pid);
      int st = 0;
      ASSERT_EQ(::waitpid(pid, &st, WNOHANG), 0)
          << "generate ended early: " << read_text(out + ".err");
      ASSERT_TRUE(std::filesystem::exists(out + ".lock"));
      ::kill(pid, sig);
      const bool ended = ended_within(pid, 20, &st);
      if (!fifo) ::close(pipe_fds[1]);  // (only now: its end would be the input's end)
      EXPECT_TRUE(ended) << "one signal did not stop a run waiting for its prompts";
      EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "status " << st;
      const std::string err = read_text(out + ".err");
      EXPECT_EQ(err, fmt::format("generate: {}: interrupted by SIG{} while reading the batch file; "
                                 "nothing was written\n",
                                 fifo ? fifo_path : "stdin", sigabbrev_np(sig)));
      for (const char* suffix : {".lock", "", ".partial", ".partial.meta.json", ".meta.json"})
        EXPECT_FALSE(std::filesystem::exists(out + suffix)) << out + suffix;
    }
  }
}

// A FIFO with a writer is read as any prompts file (O_NONBLOCK does not cut
// it short before the writer comes).
TEST(GenerateSafety, PromptsFromAFifoAreReadWhole) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("fifo_source.jsonl", prompts(5));
  const std::string plain = work_dir() + "/fifo_plain.jsonl";
  ASSERT_EQ(generate(pack, in, plain, "").status, 0);
  const std::string fifo = work_dir() + "/fifo_prompts.jsonl";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string out = work_dir() + "/fifo_results.jsonl";
  // The writer opens the FIFO a second after generate started.
  const RunResult r = run(fmt::format(
      "(sleep 1; cat {} > {}) & timeout -s KILL 60 {} --model {} --batch {} --out {}; s=$?; wait; "
      "exit $s",
      in, fifo, QTK_GENERATE_BIN, pack, fifo, out));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_text(out), read_text(plain));
}

// A --model or --chat-template that is not a regular file (a FIFO, a
// character device, a socket) is refused at once, naming it and what it is:
// a pack is mapped into memory, and opening a FIFO used to wait for a writer
// (out of reach of SIGTERM) while the lock file was held.
TEST(GenerateSafety, ModelOrTemplateThatIsNotARegularFileIsRefused) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("kinds.jsonl", prompts(1));
  const std::string fifo = work_dir() + "/kinds.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string sock = work_dir() + "/kinds.sock";
  const int sfd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sfd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(::bind(sfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string out = work_dir() + "/kinds.results.jsonl";
  auto expect_refused = [&](const RunResult& r, const std::string& says) {
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    for (const char* suffix : {".lock", "", ".partial", ".partial.meta.json", ".meta.json"})
      EXPECT_FALSE(std::filesystem::exists(out + suffix)) << out + suffix;
  };
  for (const auto& [model, kind] :
       std::vector<std::pair<std::string, std::string>>{{fifo, "a FIFO (named pipe)"},
                                                        {"/dev/null", "a character device"},
                                                        {sock, "a socket"}}) {
    SCOPED_TRACE(model);
    for (const char* devices : {"", "--devices 0,1"})
      expect_refused(
          run(fmt::format("timeout -s KILL 30 {} --model {} --batch {} --out {} {}",
                          QTK_GENERATE_BIN, model, in, out, devices)),
          model + ": expected a .pack file (a regular file, made by convert), found " + kind);
    expect_refused(
        run(fmt::format("timeout -s KILL 30 {} --model {} --batch {} --out {} --chat-template {}",
                        QTK_GENERATE_BIN, pack, in, out, model)),
        model + ": expected a regular file for the chat template, found " + kind);
  }
  ::close(sfd);
}

// A fault in a registered file mapping (the file was cut while mapped) ends
// the process with one line naming the file, exit status 1, and the files
// registered for emergencies removed; any other SIGBUS keeps its default
// action. Each case runs in a child process.
TEST(MappedFileFault, TruncatedMappingEndsWithOneLineAndCleansUp) {
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::string path = work_dir() + "/fault.bin";
  const std::string marker = work_dir() + "/fault.lock";
  const std::string err_path = work_dir() + "/fault.err";
  write_text(path, std::string(static_cast<size_t>(3 * page), 'x'));
  write_text(marker, "");
  const MappedFile mapped(path);
  register_emergency_unlink(marker);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(err, 2);
    struct rlimit no_core {};
    ::setrlimit(RLIMIT_CORE, &no_core);
    if (::truncate(path.c_str(), 0) != 0) ::_exit(2);
    volatile uint8_t sink = mapped.data()[2 * page];
    (void)sink;
    ::_exit(0);  // not reached: the read faults
  }
  unregister_emergency_unlink(marker);
  ASSERT_GT(pid, 0);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st;
  EXPECT_EQ(read_text(err_path),
            fmt::format("{}: the file {} changed while it was being read (it was truncated or "
                        "replaced in place); nothing further was written\n",
                        program_invocation_short_name, path));
  EXPECT_FALSE(std::filesystem::exists(marker)) << "the registered file was not removed";

  // A mapping made without MappedFile (not registered), and a SIGBUS sent
  // by kill: the disposition before ours (killed by SIGBUS), the file kept.
  // note: under AddressSanitizer that disposition is ASan's own SIGBUS
  // report, which aborts (the test command runs it with abort_on_error=1).
#if defined(__SANITIZE_ADDRESS__)
  constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  constexpr bool kAsan = true;
#else
  constexpr bool kAsan = false;
#endif
#else
  constexpr bool kAsan = false;
#endif
  write_text(path, std::string(static_cast<size_t>(3 * page), 'x'));
  write_text(marker, "");
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* raw = ::mmap(nullptr, static_cast<size_t>(3 * page), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(raw, MAP_FAILED);
  register_emergency_unlink(marker);
  for (const bool by_kill : {false, true}) {
    SCOPED_TRACE(by_kill ? "kill -BUS" : "an unregistered mapping");
    const pid_t p = ::fork();
    if (p == 0) {
      struct rlimit no_core {};
      ::setrlimit(RLIMIT_CORE, &no_core);
      if (by_kill) ::kill(::getpid(), SIGBUS);
      if (::truncate(path.c_str(), 0) != 0) ::_exit(2);
      volatile uint8_t sink = static_cast<const uint8_t*>(raw)[2 * page];
      (void)sink;
      ::_exit(0);
    }
    ASSERT_GT(p, 0);
    ASSERT_EQ(::waitpid(p, &st, 0), p);
    EXPECT_TRUE(WIFSIGNALED(st) && (WTERMSIG(st) == SIGBUS || (kAsan && WTERMSIG(st) == SIGABRT)))
        << "status " << st;
    EXPECT_TRUE(std::filesystem::exists(marker));
  }
  unregister_emergency_unlink(marker);
  ::munmap(raw, static_cast<size_t>(3 * page));
}

// A pack cut while generate computes from its mapping (no huge-page or
// tile-order copy): one line naming the pack, exit status 1, the lock file
// removed, the complete lines kept; --resume with the pack restored
// finishes the run. (It used to die of SIGBUS, "Bus error", with the lock
// left.)
TEST(GenerateSafety, PackCutDuringARunEndsWithOneLineAndResumes) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string copy = work_dir() + "/cut.pack";
  std::filesystem::copy_file(pack, copy, std::filesystem::copy_options::overwrite_existing);
  constexpr size_t kLines = 2000;
  const std::string in = batch_file("cut.jsonl", long_batch_text(kLines, 32));
  const std::string out = work_dir() + "/cut.results.jsonl";
  const pid_t pid =
      start_program({QTK_GENERATE_BIN, "--model", copy, "--batch", in, "--out", out, "--ignore-eos",
                     "--threads", "1", "--max-num-seqs", "1", "--no-progress"},
                    -1, out + ".err", {"QTK_HUGEPAGES=0", "QTK_TILED=0"});
  ASSERT_GT(pid, 0);
  int st = 0;
  ASSERT_TRUE(wait_for_lines(out + ".partial", 2, pid, &st))
      << "generate ended before the pack could be cut: " << read_text(out + ".err");
  ASSERT_EQ(::truncate(copy.c_str(), 0), 0);
  ASSERT_TRUE(ended_within(pid, 60, &st)) << "generate kept running on a cut pack";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st;
  EXPECT_EQ(read_text(out + ".err"),
            fmt::format("generate: the file {} changed while it was being read (it was truncated "
                        "or replaced in place); nothing further was written\n",
                        copy));
  EXPECT_FALSE(std::filesystem::exists(out + ".lock")) << "the lock file was left behind";
  const std::string partial = read_text(out + ".partial");
  ASSERT_FALSE(partial.empty());
  EXPECT_EQ(partial.back(), '\n');
  EXPECT_LT(complete_lines(out + ".partial"), kLines);
  EXPECT_FALSE(std::filesystem::exists(out));
  std::filesystem::copy_file(pack, copy, std::filesystem::copy_options::overwrite_existing);
  const RunResult again =
      generate(copy, in, out, "--ignore-eos --threads 1 --max-num-seqs 1 --resume");
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(complete_lines(out), kLines);
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
}

// ---- Output files: what generate writes besides its results, and how ----

// A batch long enough to act on a run in progress (seconds: one sequence at
// a time).
std::string long_batch(const std::string& name, size_t lines = 2000) {
  return batch_file(name, long_batch_text(lines, 64));
}

// The header of `out` says it is complete and names `out`'s own results.
void expect_a_pair(const std::string& out, const std::string& meta) {
  const nlohmann::json h = load_json(meta);
  EXPECT_EQ(h.value("status", ""), "complete") << meta;
  EXPECT_EQ(h.value("results_xxh64", ""), results_digest(read_text(out))) << meta;
}

// OUT.lock is opened with O_NOFOLLOW: a symbolic link there (to a file, or
// to nothing) is refused naming it, its target untouched; so are a FIFO and
// a directory; a regular lock file a killed run left is taken over.
TEST(GenerateOutputs, LockFileThatIsNotARegularFileIsRefused) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("lockkind.jsonl", prompts(2));
  const std::string dir = work_dir() + "/lockkind";
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/r.jsonl", lock = out + ".lock";
  const std::string victim = work_dir() + "/lockkind.victim";
  write_text(victim, "precious\n");
  struct Case {
    std::function<void()> make;
    std::string kind;
  };
  for (const Case& c : std::vector<Case>{
           {[&] { std::filesystem::create_symlink(victim, lock); }, "a symbolic link"},
           {[&] { std::filesystem::create_symlink(dir + "/missing", lock); }, "a symbolic link"},
           {[&] { ASSERT_EQ(::mkfifo(lock.c_str(), 0644), 0); }, "a FIFO (named pipe)"},
           {[&] { std::filesystem::create_directory(lock); }, "a directory"}}) {
    SCOPED_TRACE(c.kind);
    c.make();
    for (const char* flags : {"", "--force"}) {
      const RunResult r = generate(pack, in, out, flags);
      EXPECT_EQ(r.status, 1) << r.err;
      EXPECT_EQ(r.err, fmt::format("generate: {}: the lock file {} is {}; expected a regular file "
                                   "or no file there (generate and merge create it; remove it)\n",
                                   out, lock, c.kind));
    }
    EXPECT_EQ(read_text(victim), "precious\n");
    EXPECT_FALSE(std::filesystem::exists(dir + "/missing"));
    EXPECT_EQ(names_starting(dir, "r.jsonl"), std::vector<std::string>{"r.jsonl.lock"});
    std::filesystem::remove(lock);
  }
  // A hard link at the lock's name (O_NOFOLLOW does not see one) is refused
  // too: the file it names (a user's file, or OUT itself) is left unchanged.
  for (const std::string& target : {victim, out}) {
    SCOPED_TRACE(target);
    write_text(target, "precious\n");
    ASSERT_EQ(::link(target.c_str(), lock.c_str()), 0);
    for (const char* flags : {"", "--force", "--resume"}) {
      const RunResult r = generate(pack, in, out, flags);
      EXPECT_EQ(r.status, 1) << r.err;
      EXPECT_EQ(r.err, fmt::format("generate: {}: the lock file {} has 2 hard links; expected a "
                                   "file of its own (generate and merge create it; remove it)\n",
                                   out, lock));
    }
    EXPECT_EQ(read_text(target), "precious\n");
    EXPECT_EQ(read_text(lock), "precious\n");
    std::filesystem::remove(lock);
    if (target == out) std::filesystem::remove(out);
  }
  EXPECT_EQ(read_text(victim), "precious\n");
  // A stale lock file (a SIGKILLed run's, with its pid) is taken over.
  write_text(lock, fmt::format("{}\n", dead_pid()));
  const RunResult ok = generate(pack, in, out, "");
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_FALSE(std::filesystem::exists(lock));
  expect_a_pair(out, out + ".meta.json");
}

// No file is written through a symbolic link at one of generate's derived
// names: --force replaces a link at OUT.partial, at OUT.meta.json and at the
// pid-named temporary files (made here by a shell that then execs generate,
// which keeps its pid), never the file it points to; --resume refuses an
// OUT.partial that is a link.
TEST(GenerateOutputs, SymlinksAtDerivedNamesAreReplacedNotFollowed) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("links.jsonl", prompts(3));
  const std::string dir = work_dir() + "/links";
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/r.jsonl";
  ASSERT_EQ(generate(pack, in, out, "").status, 0);
  const std::string expected = read_text(out);
  std::vector<std::string> victims;
  auto victim = [&](const std::string& name) {
    const std::string v = work_dir() + "/links.victim." + name;
    write_text(v, "precious " + name + "\n");
    victims.push_back(v);
    return v;
  };
  std::filesystem::create_symlink(victim("partial"), out + ".partial");
  std::filesystem::create_symlink(victim("partial-meta"), out + ".partial.meta.json");
  std::filesystem::remove(out + ".meta.json");
  std::filesystem::create_symlink(victim("meta"), out + ".meta.json");
  std::string links;
  for (const std::string name : {".meta.json.tmp.", ".meta.json.prev.", ".partial.meta.json.tmp."})
    links += fmt::format("ln -s {} {}{}$$ && ", victim(name.substr(1, name.size() - 2)), out, name);
  const RunResult r = run(fmt::format("{}exec {} --model {} --batch {} --out {} --force", links,
                                      QTK_GENERATE_BIN, pack, in, out));
  ASSERT_EQ(r.status, 0) << r.err;
  for (const std::string& v : victims) {
    const std::string name = v.substr(v.rfind(".victim.") + 8);
    EXPECT_EQ(read_text(v), "precious " + name + "\n") << "written through a link: " << v;
  }
  EXPECT_FALSE(std::filesystem::is_symlink(out));
  EXPECT_FALSE(std::filesystem::is_symlink(out + ".meta.json"));
  EXPECT_EQ(read_text(out), expected);
  expect_a_pair(out, out + ".meta.json");
  EXPECT_EQ(names_starting(dir, "r.jsonl"),
            (std::vector<std::string>{"r.jsonl", "r.jsonl.meta.json"}));
  // --resume does not append through a link at OUT.partial.
  write_killed_run(out, expected.substr(0, expected.find('\n') + 1), out + ".meta.json");
  std::filesystem::remove(out + ".partial");
  std::filesystem::create_symlink(victims[0], out + ".partial");
  write_text(victims[0], expected.substr(0, expected.find('\n') + 1));
  const RunResult resumed = generate(pack, in, out, "--resume");
  EXPECT_EQ(resumed.status, 1) << resumed.err;
  EXPECT_NE(resumed.err.find(out + ".partial: is a symbolic link; expected the partial results"),
            std::string::npos)
      << resumed.err;
  EXPECT_EQ(read_text(victims[0]), expected.substr(0, expected.find('\n') + 1));
}

// The final move keeps OUT and its header a pair: when the results cannot
// be moved into place (an immutable OUT: the rename fails with EPERM) the
// new header is taken back, OUT and OUT.meta.json stay as they were and
// OUT.partial keeps the results for --resume. A kill between the header's
// rename and the results' leaves the new header beside the old OUT (its
// results_xxh64 tells them apart) and OUT.partial: --resume completes the
// pair and removes what the killed run left.
TEST(GenerateOutputs, FinalMoveKeepsResultsAndHeaderTogether) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string a = batch_file("pair.a.jsonl", prompts(3, 0));
  const std::string b = batch_file("pair.b.jsonl", prompts(3, 9));
  const std::string dir = work_dir() + "/pair";
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/r.jsonl", meta = out + ".meta.json";
  const std::string fresh_b = dir + "/b.jsonl";
  ASSERT_EQ(generate(pack, b, fresh_b, "").status, 0);
  ASSERT_EQ(generate(pack, a, out, "").status, 0);
  const std::string old_results = read_text(out), old_header = read_text(meta);

  const RunResult r =
      run(with_faults("QTK_FAULT_RENAME_TO=" + out) +
          fmt::format("{} --model {} --batch {} --out {} --force", QTK_GENERATE_BIN, pack, b, out));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err, fmt::format("generate: {}: cannot move the completed results into place: "
                               "Operation not permitted; {} and {} are as they were ({}.partial "
                               "keeps the results; --resume finishes the run)\n",
                               out, out, meta, out));
  EXPECT_EQ(read_text(out), old_results);
  EXPECT_EQ(read_text(meta), old_header) << "the new header was left beside the old results";
  EXPECT_EQ(read_text(out + ".partial"), read_text(fresh_b));
  EXPECT_EQ(load_json(out + ".partial.meta.json").value("status", ""), "failed");
  EXPECT_EQ(names_starting(dir, "r.jsonl"),
            (std::vector<std::string>{"r.jsonl", "r.jsonl.meta.json", "r.jsonl.partial",
                                      "r.jsonl.partial.meta.json"}));
  const RunResult resumed = generate(pack, b, out, "--resume");
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_EQ(read_text(out), read_text(fresh_b));
  expect_a_pair(out, meta);

  // Killed between the two renames.
  const RunResult killed =
      run(with_faults("QTK_FAULT_KILL_AT_RENAME_TO=" + out) +
          fmt::format("{} --model {} --batch {} --out {} --force", QTK_GENERATE_BIN, pack, a, out));
  EXPECT_EQ(killed.status, 128 + SIGKILL) << killed.err;
  EXPECT_EQ(read_text(out), read_text(fresh_b)) << "the old results stay";
  EXPECT_EQ(load_json(meta).value("status", ""), "complete");
  EXPECT_NE(load_json(meta).value("results_xxh64", ""), results_digest(read_text(out)));
  EXPECT_EQ(read_text(out + ".partial"), old_results);
  const auto left = names_starting(dir, "r.jsonl.meta.json.prev.");
  ASSERT_EQ(left.size(), 1u) << "the old header's link";
  const RunResult repaired = generate(pack, a, out, "--resume");
  ASSERT_EQ(repaired.status, 0) << repaired.err;
  EXPECT_NE(repaired.err.find("generate: removed stale temporary file " + dir + "/" + left[0]),
            std::string::npos)
      << repaired.err;
  EXPECT_EQ(read_text(out), old_results);
  expect_a_pair(out, meta);
  EXPECT_EQ(names_starting(dir, "r.jsonl"),
            (std::vector<std::string>{"r.jsonl", "r.jsonl.meta.json"}));
}

// Without --force the final move never replaces a file that appeared while
// the run worked: one written at OUT by another process mid-run, or at the
// header's name (as the rename is made: RENAME_NOREPLACE, or link() on a
// file system without it) is kept, the run exits 1 naming it, and
// OUT.partial keeps the results for --resume, which then replaces it.
TEST(GenerateOutputs, AnOutputThatAppearsDuringTheRunIsNotReplaced) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = long_batch("appear.jsonl");
  const std::string dir = work_dir() + "/appear";
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/a.jsonl", err = dir + "/../appear.err";
  const pid_t pid = start_with_default_signals(
      {QTK_GENERATE_BIN, "--model", pack, "--batch", in, "--out", out, "--ignore-eos", "--threads",
       "1", "--max-num-seqs", "1", "--no-progress"},
      false, {}, "/dev/null", err);
  int st = 0;
  ASSERT_TRUE(wait_for_lines(out + ".partial", 2, pid, &st))
      << "generate ended before the file could appear (status " << st << ")";
  write_text(out, "precious\n");
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st;
  EXPECT_EQ(read_text(err),
            fmt::format("generate: {}: appeared while generating (it was not there when the run "
                        "started); not replacing it; {} and {}.meta.json are as they were "
                        "({}.partial keeps the results; --resume finishes the run into {}, "
                        "replacing what is there then)\n",
                        out, out, out, out, out));
  EXPECT_EQ(read_text(out), "precious\n");
  EXPECT_FALSE(std::filesystem::exists(out + ".meta.json"));
  EXPECT_EQ(complete_lines(out + ".partial"), 2000u);
  const RunResult resumed = generate(pack, in, out, "--ignore-eos --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_EQ(complete_lines(out), 2000u);
  expect_a_pair(out, out + ".meta.json");

  // The header's name, taken as the rename is made; also where the file
  // system has no RENAME_NOREPLACE; and --meta's own name.
  const std::string small = batch_file("appear.small.jsonl", prompts(2));
  for (const std::string extra : {"", "QTK_FAULT_NO_RENAME_NOREPLACE=1"}) {
    for (const std::string& meta_flag : {std::string(), " --meta " + dir + "/h.json"}) {
      SCOPED_TRACE(extra + meta_flag);
      const std::string o = dir + "/b.jsonl";
      const std::string meta = meta_flag.empty() ? o + ".meta.json" : dir + "/h.json";
      const RunResult r = run(with_faults("QTK_FAULT_CREATE_AT_RENAME_TO=" + meta + " " + extra) +
                              fmt::format("{} --model {} --batch {} --out {}{}", QTK_GENERATE_BIN,
                                          pack, small, o, meta_flag));
      EXPECT_EQ(r.status, 1) << r.err;
      EXPECT_EQ(r.err.rfind(fmt::format("generate: {}: appeared while generating", meta), 0), 0u)
          << r.err;
      EXPECT_NE(r.err.find("b.jsonl.partial keeps the results; --resume finishes the run"),
                std::string::npos)
          << r.err;
      EXPECT_EQ(read_text(meta), "appeared\n");
      EXPECT_FALSE(std::filesystem::exists(o));
      EXPECT_TRUE(std::filesystem::exists(o + ".partial"));
      // --force replaces it.
      const RunResult forced = generate(pack, small, o, "--force" + meta_flag);
      ASSERT_EQ(forced.status, 0) << forced.err;
      expect_a_pair(o, meta);
      std::filesystem::remove(o);
      std::filesystem::remove(meta);
    }
  }
  EXPECT_EQ(names_starting(dir, "b.jsonl"), std::vector<std::string>{});
}

// Each of `names` in `dir` is gone, and run `r` said so in one line.
void expect_stale_removed(const RunResult& r, const std::string& dir,
                          const std::vector<std::string>& names, pid_t dead) {
  for (const std::string& name : names) {
    EXPECT_FALSE(std::filesystem::exists(dir + "/" + name)) << name;
    EXPECT_NE(r.err.find(fmt::format("generate: removed stale temporary file {}/{} left by pid {}, "
                                     "which is no longer running\n",
                                     dir, name, dead)),
              std::string::npos)
        << r.err;
  }
}

// What a SIGKILL leaves of generate's and merge's pid-named temporary files
// beside OUT is removed by the next run that takes OUT.lock, once that pid
// is gone, one line on stderr each; those of a live pid, other names and
// other OUTs' are kept.
TEST(GenerateOutputs, StaleTemporariesOfKilledRunsAreRemoved) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("stale.jsonl", prompts(2));
  const std::string dir = work_dir() + "/stale";
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/r.jsonl";
  const pid_t dead = dead_pid(), live = ::getpid();
  const std::vector<std::string> stale = {
      fmt::format("r.jsonl.meta.json.tmp.{}", dead),
      fmt::format("r.jsonl.meta.json.prev.{}", dead),
      fmt::format("r.jsonl.partial.meta.json.tmp.{}", dead),
      fmt::format("r.jsonl.merge.{}", dead),
      fmt::format("r.jsonl.merge.{}.tmp.{}", dead, dead),
  };
  const std::vector<std::string> kept = {
      fmt::format("r.jsonl.meta.json.tmp.{}", live),
      fmt::format("r.jsonl.merge.{}", live),
      "r.jsonl.meta.json.tmp.x1",
      // generate never writes a pid with leading zeros: someone else's file.
      fmt::format("r.jsonl.meta.json.tmp.0{}", dead),
      "r.jsonl.merge.00123",
      fmt::format("r.jsonl.meta.json.tmp.{}.bak", dead),
      fmt::format("other.jsonl.meta.json.tmp.{}", dead),
  };
  for (const std::string& name : stale) write_text(dir + "/" + name, "left\n");
  for (const std::string& name : kept) write_text(dir + "/" + name, "kept\n");
  const RunResult r = generate(pack, in, out, "");
  ASSERT_EQ(r.status, 0) << r.err;
  expect_stale_removed(r, dir, stale, dead);
  for (const std::string& name : kept) EXPECT_EQ(read_text(dir + "/" + name), "kept\n") << name;
  expect_a_pair(out, out + ".meta.json");
}

// A `--out - --meta M` run takes no lock, but what a killed one left of M's
// temporaries (M.tmp.PID, M.prev.PID of a pid no longer running) is removed
// by the next such run, one line each; a live pid's is kept.
TEST(GenerateOutputs, StdoutRunRemovesStaleHeaderTemporaries) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("stale_stdout.jsonl", prompts(2));
  const std::string dir = work_dir() + "/stale_stdout";
  std::filesystem::create_directories(dir);
  const std::string meta = dir + "/h.json";
  const pid_t dead = dead_pid();
  const std::vector<std::string> stale = {fmt::format("h.json.tmp.{}", dead),
                                          fmt::format("h.json.prev.{}", dead)};
  const std::string live = fmt::format("h.json.tmp.{}", ::getpid());
  for (const std::string& name : stale) write_text(dir + "/" + name, "left\n");
  write_text(dir + "/" + live, "kept\n");
  const RunResult r = run(
      fmt::format("{} --model {} --batch {} --out - --meta {}", QTK_GENERATE_BIN, pack, in, meta));
  ASSERT_EQ(r.status, 0) << r.err;
  expect_stale_removed(r, dir, stale, dead);
  EXPECT_EQ(read_text(dir + "/" + live), "kept\n");
  EXPECT_EQ(load_json(meta)["status"], "complete");
}

// With --out - the run header (--meta M) is written once, atomically, when
// the run completes: a run stopped by a signal or by its reader going away
// leaves the previous M as it was (--force), or no M at all; a complete run
// writes it; without --force one that appeared meanwhile is not replaced.
TEST(GenerateOutputs, StdoutRunWritesItsHeaderOnlyWhenItCompletes) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = long_batch("stdout_meta.jsonl");
  const std::string dir = work_dir() + "/stdout_meta";
  std::filesystem::create_directories(dir);
  const std::string meta = dir + "/h.json", results = dir + "/results.txt";
  write_text(meta, "{\"previous\": true}\n");
  const pid_t pid = start_with_default_signals(
      {QTK_GENERATE_BIN, "--model", pack, "--batch", in, "--out", "-", "--meta", meta, "--force",
       "--ignore-eos", "--threads", "1", "--max-num-seqs", "1", "--no-progress"},
      false, {}, results);
  int st = 0;
  ASSERT_TRUE(wait_for_lines(results, 2, pid, &st)) << "status " << st;
  EXPECT_EQ(read_text(meta), "{\"previous\": true}\n") << "replaced at the start";
  ::kill(pid, SIGTERM);
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) << "status " << st;
  EXPECT_EQ(read_text(meta), "{\"previous\": true}\n");
  // The reader gone (SIGPIPE).
  const RunResult piped =
      run(fmt::format("{} --model {} --batch {} --out - --meta {} --force --ignore-eos --threads 1 "
                      "--max-num-seqs 1 2>&1 | head -c 100 >/dev/null",
                      QTK_GENERATE_BIN, pack, in, meta));
  EXPECT_EQ(read_text(meta), "{\"previous\": true}\n") << piped.out << piped.err;
  EXPECT_EQ(names_starting(dir, "h.json"), std::vector<std::string>{"h.json"});
  // No M before: none after a failed run either.
  const std::string none = dir + "/none.json";
  const RunResult failed = run(
      fmt::format("ulimit -f 1; {} --model {} --batch {} --out - --meta {} --margins --ignore-eos",
                  QTK_GENERATE_BIN, pack, in, none));
  EXPECT_NE(failed.status, 0);
  EXPECT_FALSE(std::filesystem::exists(none));
  // Complete: written.
  const std::string small = batch_file("stdout_meta.small.jsonl", prompts(2));
  const RunResult ok = run(fmt::format("{} --model {} --batch {} --out - --meta {} --force",
                                       QTK_GENERATE_BIN, pack, small, meta));
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(load_json(meta).value("status", ""), "complete");
  // Without --force, a header that appeared meanwhile is kept.
  const std::string later = dir + "/later.json";
  const RunResult appeared = run(with_faults("QTK_FAULT_CREATE_AT_RENAME_TO=" + later) +
                                 fmt::format("{} --model {} --batch {} --out - --meta {}",
                                             QTK_GENERATE_BIN, pack, small, later));
  EXPECT_EQ(appeared.status, 1) << appeared.err;
  EXPECT_EQ(appeared.err,
            fmt::format("generate: {}: appeared while generating (it was not there when the run "
                        "started); not replacing it (pass --force to replace it; the results went "
                        "to stdout)\n",
                        later));
  EXPECT_EQ(read_text(later), "appeared\n");
}

// A failed fsync of the directory after the final renames is an error
// (exit 1) that says the results are in place; nothing is left half-done.
TEST(GenerateOutputs, FailedDirectoryFsyncIsReported) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("dirsync.jsonl", prompts(2));
  const std::string dir = work_dir() + "/dirsync";
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/r.jsonl";
  const RunResult r =
      run(with_faults("QTK_FAULT_DIR_FSYNC=1") +
          fmt::format("{} --model {} --batch {} --out {}", QTK_GENERATE_BIN, pack, in, out));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err, fmt::format("generate: {}: the results and their header are in place, but the "
                               "fsync of directory {} failed: Input/output error; a crash could "
                               "still undo the move\n",
                               out, dir));
  expect_a_pair(out, out + ".meta.json");
  EXPECT_EQ(names_starting(dir, "r.jsonl"),
            (std::vector<std::string>{"r.jsonl", "r.jsonl.meta.json"}));
}

// convert the same way: a failed fsync of the pack's directory after the
// rename is exit 1, and the line says the pack is in place (it is).
TEST(ConvertOutput, FailedDirectoryFsyncSaysThePackIsInPlace) {
  const std::string dir = work_dir() + "/convsync";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string pack = dir + "/m.pack";
  const RunResult r = run(with_faults("QTK_FAULT_DIR_FSYNC=1") +
                          fmt::format("{} {} {}", QTK_CONVERT_BIN, src(kTiny), pack));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err, fmt::format("convert: {}: written and in place, but the fsync of directory {} "
                               "failed: Input/output error; a crash could still undo the rename\n",
                               pack, dir));
  EXPECT_EQ(names_starting(dir, ""), (std::vector<std::string>{"m.pack"}));
  const RunResult check =
      run(fmt::format("{} --model {} --batch {} --out {}/r.jsonl", QTK_GENERATE_BIN, pack,
                      batch_file("convsync.jsonl", prompts(1)), dir));
  EXPECT_EQ(check.status, 0) << check.err;
}

// --show's continuations go to stdout; a write that fails there (a full
// disk) is exit 1 with one line, after the results file is complete.
TEST(GenerateOutputs, ShowToAFullStdoutIsAnError) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("showfull.jsonl", prompts(2));
  const std::string dir = work_dir() + "/showfull";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/r.jsonl";
  const RunResult r = run(fmt::format("({} --model {} --batch {} --out {} --show > /dev/full)",
                                      QTK_GENERATE_BIN, pack, in, out));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err, fmt::format("generate: cannot write to standard output: No space left on "
                               "device (--show); the results in {} are complete\n",
                               out));
  expect_a_pair(out, out + ".meta.json");
  const RunResult help = run(fmt::format("({} --help > /dev/full)", QTK_GENERATE_BIN));
  EXPECT_EQ(help.status, 1);
  EXPECT_NE(help.err.find("cannot write to standard output"), std::string::npos) << help.err;
}

// Names derived with a pid are sized for the widest pid the system gives
// (pid_max - 1), not this process's: a --devices worker or a later --resume
// may have a longer pid than the run that checked the name. An OUT one byte
// too long for OUT.partial.meta.json.tmp.<widest pid> is refused.
TEST(GenerateOutputs, DerivedNamesAreSizedForTheWidestPid) {
  long pid_max = 0;
  std::istringstream(read_text("/proc/sys/kernel/pid_max")) >> pid_max;
  ASSERT_GT(pid_max, 1);
  EXPECT_EQ(widest_pid(), std::max<long>(pid_max - 1, ::getpid()));
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("widest.jsonl", prompts(2));
  const std::string dir = work_dir() + "/widest";
  std::filesystem::create_directories(dir);
  const std::string tail = ".partial.meta.json.tmp." + std::to_string(widest_pid());
  const std::string name = std::string(256 - tail.size() - 6, 'w') + ".jsonl";
  const RunResult r = generate(pack, in, dir + "/" + name, "");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find(fmt::format("the name is too long for the files generate writes beside "
                                   "it: {}{} would be a 256-byte name",
                                   name, tail)),
            std::string::npos)
      << r.err;
  // One byte shorter runs.
  ASSERT_EQ(generate(pack, in, dir + "/" + name.substr(1), "").status, 0);
}

// Output paths the file system cannot hold are refused up front, saying
// why: a name whose derived names (OUT.partial.meta.json.tmp.PID) pass the
// name length limit, a path over PATH_MAX, a parent that is a file.
TEST(GenerateOutputs, OutputPathsAreCheckedForLengthAndParents) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = batch_file("names.jsonl", prompts(2));
  const std::string dir = work_dir() + "/names";
  std::filesystem::create_directories(dir);
  // 240 bytes: a valid name, but OUT.partial.meta.json is 258.
  const std::string name = std::string(234, 'n') + ".jsonl";
  const RunResult r = generate(pack, in, dir + "/" + name, "");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find(fmt::format("generate: --out {}/{}: the name is too long for the files "
                                   "generate writes beside it: {}.partial.meta.json would be a "
                                   "258-byte name, over the file system's limit of 255 bytes "
                                   "(expected a name of at most",
                                   dir, name, name)),
            std::string::npos)
      << r.err;
  // A name that leaves room runs.
  const std::string fits = std::string(194, 'f') + ".jsonl";
  ASSERT_EQ(generate(pack, in, dir + "/" + fits, "").status, 0);
  // A --meta name too long for its temporary names.
  const RunResult m =
      generate(pack, in, dir + "/m.jsonl", "--meta " + dir + "/" + std::string(250, 'h'));
  EXPECT_EQ(m.status, 1) << m.err;
  EXPECT_NE(m.err.find("the name is too long for the files generate writes beside it: " +
                       std::string(250, 'h') + ".tmp."),
            std::string::npos)
      << m.err;
  // A path over PATH_MAX.
  const std::string long_path = dir + "/" + std::string(4100, 'p') + ".jsonl";
  const RunResult p = generate(pack, in, long_path, "");
  EXPECT_EQ(p.status, 1) << p.err;
  EXPECT_NE(p.err.find(fmt::format("cannot write the results: the path is {} bytes, longer than "
                                   "the system allows (4095 bytes)",
                                   long_path.size())),
            std::string::npos)
      << p.err;
  // A parent that is a file, directly or further up.
  write_text(dir + "/p.jsonl", "a file\n");
  for (const std::string& o : {dir + "/p.jsonl/r.jsonl", dir + "/p.jsonl/x/r.jsonl"}) {
    const RunResult f = generate(pack, in, o, "");
    EXPECT_EQ(f.status, 1) << f.err;
    EXPECT_EQ(f.err, fmt::format("generate: {}: cannot write the results: {}/p.jsonl is not a "
                                 "directory (it is a regular file)\n",
                                 o, dir));
  }
  EXPECT_EQ(read_text(dir + "/p.jsonl"), "a file\n");
  EXPECT_EQ(names_starting(dir, ""),
            (std::vector<std::string>{fits, fits + ".meta.json", "p.jsonl"}));
}

// ---- A second signal: the process ends at once, its lock file removed ----

// OutputLock puts its file on the list of files that a second signal
// removes as it ends the process at once (exit status 128 + the signal),
// whatever installed the signal handlers: an InterruptScope before the lock
// (generate, merge) or after it (a --devices parent), and takes it off the
// list when released (a second signal then leaves alone the lock file of
// another run at that name); a lock that installed the handlers itself still
// removes its file at the first signal. Each case runs in a child process.
// (With an InterruptScope before or after the lock, the file was not on the
// list: a second signal left it behind.)
TEST(OutputLockSignals, SecondSignalRemovesTheLockWhateverInstalledTheHandlers) {
  const std::string dir = work_dir() + "/lock_signals";
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/r.jsonl", lock = out + ".lock";
  enum class Case { kScopeFirst, kLockFirst, kReleased, kLockAlone };
  for (const Case c : {Case::kScopeFirst, Case::kLockFirst, Case::kReleased, Case::kLockAlone}) {
    SCOPED_TRACE(static_cast<int>(c));
    std::filesystem::remove(lock);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    const std::string err = dir + "/child.err";
    if (pid == 0) {
      for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(e, 2);
      try {
        std::optional<InterruptScope> scope;
        std::optional<OutputLock> held;
        if (c == Case::kLockFirst || c == Case::kLockAlone) {
          held.emplace(lock, out);
          if (c == Case::kLockFirst) scope.emplace();
        } else {
          scope.emplace(InterruptScope::Syscalls::kRestarted);
          held.emplace(lock, out);
        }
        if (c == Case::kReleased) {
          held.reset();
          write_text(lock, "another run's\n");
        }
        ::raise(SIGINT);  // recorded (the program stops at its next check)
        ::raise(SIGINT);  // ends the process at once
      } catch (...) {
        ::_exit(2);
      }
      ::_exit(0);
    }
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    // (a lock alone: the default disposition after its handler; with a
    // scope: the second signal, which ends the process by that signal too)
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT) << "status " << st;
    EXPECT_EQ(read_text(err), c == Case::kLockAlone
                                  ? ""
                                  : fmt::format("{}: stopped at once by a second SIGINT\n",
                                                program_invocation_short_name));
    if (c == Case::kReleased)
      EXPECT_EQ(read_text(lock), "another run's\n");
    else
      EXPECT_FALSE(std::filesystem::exists(lock)) << "the lock file was left behind";
  }
}

// A run that gets SIGINT twice while it cannot reach its next check (here
// blocked writing its progress line to stderr, a pipe nobody reads, as
// behind `2>&1 | less` left paused) ends at the second signal at once, by
// that signal, its lock file removed; its partial results stay, and --resume
// finishes them. (The lock file used to be left behind: generate's own
// handlers were installed, and OutputLock put it on the list of files a
// second signal removes only where it installed none.)
TEST(GenerateSafety, SecondSignalEndsABlockedRunAndRemovesItsLock) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = long_batch("second_signal.in.jsonl");
  const std::string out = work_dir() + "/second_signal.results.jsonl";
  const FullPipe err;
  ASSERT_GE(err.write_fd(), 0);
  const pid_t pid = start_with_default_signals(
      {QTK_GENERATE_BIN, "--model", pack, "--batch", in, "--out", out, "--ignore-eos", "--threads",
       "1", "--max-num-seqs", "1", "--progress"},
      false, {}, "/dev/null", "", err.write_fd());
  ASSERT_GT(pid, 0);
  // The run under way (its lock held, its results started), then blocked.
  int st = 0;
  ASSERT_TRUE(running_until(
      pid, [&] { return std::filesystem::exists(out + ".partial"); }, &st, 3000))
      << "generate ended early: status " << st;
  wait_until_blocked(pid);
  ASSERT_EQ(::waitpid(pid, &st, WNOHANG), 0) << "generate ended early: status " << st;
  ASSERT_TRUE(std::filesystem::exists(out + ".lock"));
  // (the write it waits in is restarted: one signal only recorded)
  ASSERT_TRUE(still_running_after(pid, SIGINT, &st))
      << "one signal ended the blocked run: status " << st;
  ::kill(pid, SIGINT);
  ASSERT_TRUE(ended_within(pid, 20, &st)) << "a second signal did not end the run at once";
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT) << "status " << st;
  EXPECT_FALSE(std::filesystem::exists(out + ".lock")) << "the lock file was left behind";
  EXPECT_FALSE(std::filesystem::exists(out));
  ASSERT_TRUE(std::filesystem::exists(out + ".partial"));
  const RunResult again =
      generate(pack, in, out, "--ignore-eos --threads 1 --max-num-seqs 1 --resume");
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(complete_lines(out), 2000u);
  EXPECT_EQ(names_starting(work_dir(), "second_signal.results"),
            (std::vector<std::string>{"second_signal.results.jsonl",
                                      "second_signal.results.jsonl.meta.json"}));
}

// A run blocked writing its results to stdout (`--out -` into a reader that
// stopped reading, as `| less` left paused) stops at the first SIGINT, by
// that signal, with one line.
TEST(GenerateSafety, SignalStopsARunBlockedOnItsStdout) {
  const std::string pack = pack_of(kTiny);
  ASSERT_FALSE(pack.empty());
  const std::string in = long_batch("blocked_stdout.in.jsonl");
  const std::string err = work_dir() + "/blocked_stdout.err";
  const FullPipe out;
  ASSERT_GE(out.write_fd(), 0);
  // (the child opens the pipe again through /proc as its stdout)
  const pid_t pid = start_with_default_signals(
      {QTK_GENERATE_BIN, "--model", pack, "--batch", in, "--out", "-", "--ignore-eos", "--threads",
       "1", "--max-num-seqs", "1", "--no-progress"},
      false, {}, fmt::format("/proc/self/fd/{}", out.write_fd()), err);
  ASSERT_GT(pid, 0);
  wait_until_blocked(pid);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, WNOHANG), 0) << "generate ended early: status " << st;
  ::kill(pid, SIGINT);
  ASSERT_TRUE(ended_within(pid, 20, &st)) << "one signal did not stop the blocked run";
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT) << "status " << st;
  EXPECT_EQ(read_text(err),
            "generate: standard output: interrupted by SIGINT while waiting for its reader to take "
            "the results\n");
}

}  // namespace
}  // namespace qtk::rt_test
