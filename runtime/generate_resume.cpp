#include "runtime/generate_resume.h"

#include <algorithm>

#include <variant>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json.h"
#include "core/read_file.h"
#include "kernels/cpu_features.h"
#include "pack/pack_checksum.h"
#include "runtime/results_file.h"
#include "runtime/scheduler.h"

namespace qtk {

namespace {

constexpr size_t kDigestChars = 16;

// The settings that change the results: resuming with another value would
// mix two different runs in one file.
// note: device and precision change the arithmetic, hence the results;
// allow_unknown_fields turns error lines into results; chat_template (null
// for runs without "messages" lines) decides the prompts of chat lines.
constexpr const char* kResultSettings[] = {
    "max_tokens_default", "ignore_eos",           "margins",       "logprobs",       "device",
    "precision",          "allow_unknown_fields", "chat_template", "tensor_parallel"};

nlohmann::json at(const nlohmann::json& j, const std::string& pointer) {
  return j.value(nlohmann::json::json_pointer(pointer), nlohmann::json());
}

void check_same_prompts(const nlohmann::json& old, const nlohmann::json& meta,
                        const std::string& header, const std::string& batch) {
  const nlohmann::json was = at(old, "/input_line_xxh64"), now = meta["input_line_xxh64"];
  if (!was.is_string()) {
    fail(
        "{}: cannot resume: the run header has no digest of the prompts file (made by an older "
        "qtk), so {} cannot be checked against it; start over with --force",
        header, batch);
  }
  const std::string& a = was.get_ref<const std::string&>();
  const std::string& b = now.get_ref<const std::string&>();
  const size_t n = std::min(a.size(), b.size()) / kDigestChars;
  for (size_t i = 0; i < n; ++i) {
    if (a.compare(i * kDigestChars, kDigestChars, b, i * kDigestChars, kDigestChars) != 0) {
      fail(
          "{}: cannot resume: line {} is not the line {} the run was started with (its digest "
          "differs; the results would mix two inputs)",
          batch, i + 1, i + 1);
    }
  }
  if (a.size() != b.size()) {
    fail("{}: cannot resume: it has {} lines, the prompts file the run was started with had {}",
         batch, b.size() / kDigestChars, a.size() / kDigestChars);
  }
}

// The switches that can change a token or a margin on `device` (cpu | cuda).
bool changes_results(TuningEffect e, const std::string& device) {
  return (e == TuningEffect::kCpuResults && device == "cpu") ||
         (e == TuningEffect::kCudaResults && device == "cuda");
}

// What a header without the switch (written by an older qtk) ran with:
// the default, except for switches whose default is not what builds before
// them computed.
// note: QTK_GEMM_SLICES came with a default of 4; the builds before it ran
// every product as one chain over K, i.e. 1.
nlohmann::json value_before_switch(const std::string& name, const nlohmann::json& defaults) {
  if (name == "QTK_GEMM_SLICES") return 1;
  return defaults[name];
}

}  // namespace

TuningDifference result_tuning_difference(const nlohmann::json& old, const nlohmann::json& meta) {
  const nlohmann::json was_all = at(old, "/tuning");
  const nlohmann::json defaults = tuning_header(Tuning{});
  const nlohmann::json device_json = at(meta, "/settings/device");
  const std::string device = device_json.is_string() ? device_json.get<std::string>() : "";
  const nlohmann::json now_all = at(meta, "/tuning");
  for (const TuningEntry& e : Tuning{}.entries()) {
    if (!changes_results(e.effect, device)) continue;
    // note: a header without the switch (an older qtk) is taken as a run
    // with what that build computed, its default (QTK_CPU_PATH: this CPU's
    // best path) unless value_before_switch says otherwise: refusing it
    // would strand every interrupted run of an older build.
    nlohmann::json was = was_all.is_object() ? was_all.value(e.name, nlohmann::json()) : nullptr;
    if (was.is_null()) was = value_before_switch(e.name, defaults);
    nlohmann::json now = now_all.is_object() ? now_all.value(e.name, nlohmann::json()) : nullptr;
    if (now.is_null()) now = value_before_switch(e.name, defaults);
    if (was != now) return {e.name, was, now};
  }
  return {};
}

namespace {

void check_same_tuning(const nlohmann::json& old, const nlohmann::json& meta,
                       const std::string& header) {
  if (const TuningDifference d = result_tuning_difference(old, meta); !d.name.empty()) {
    fail("{}: cannot resume: {} was {}, now {} (it can change tokens and margins on {})", header,
         d.name, json_file_text(d.was, -1), json_file_text(d.now, -1),
         meta["settings"].value("device", ""));
  }
}

}  // namespace

nlohmann::json tuning_header(const Tuning& t) {
  nlohmann::json j = nlohmann::json::object();
  for (const TuningEntry& e : t.entries())
    std::visit([&](const auto& v) { j[e.name] = v; }, e.value);
  if (t.cpu_path.empty())
    j["QTK_CPU_PATH"] = std::string(cpu_path_name(supported_cpu_paths().back()));
  return j;
}

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

std::string input_line_digests(const std::vector<std::string_view>& lines) {
  std::string s;
  s.reserve(lines.size() * kDigestChars);
  // note: line 1 without its byte order mark and every line without its
  // CR, as the prompt parser reads them: the same prompts with other line
  // ends, or a BOM added by an editor, are the same lines to --resume.
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string_view l = i == 0 ? without_byte_order_mark(lines[i]) : lines[i];
    s += checksum_hex(xxh64(l.data(), l.size()));
  }
  return s;
}

// Why `j`, a kept line for request `r`, is not a result line generate writes
// under `settings` (empty when it is one): the output's tokens, their end,
// margins and log-probabilities as this run would write them.
std::string not_a_result_line(const nlohmann::json& j, const SequenceRequest& r,
                              const nlohmann::json& settings, int64_t vocab_size) {
  const auto out = j.find("output_token_ids");
  if (out == j.end() || !out->is_array()) return "field 'output_token_ids': expected an array";
  if (static_cast<int64_t>(out->size()) > r.max_tokens)
    return fmt::format("field 'output_token_ids': {} tokens, past the request's max_tokens {}",
                       out->size(), r.max_tokens);
  const auto stops = [&](int64_t t) {
    return std::find(r.stop_ids.begin(), r.stop_ids.end(), t) != r.stop_ids.end();
  };
  for (size_t k = 0; k < out->size(); ++k) {
    const auto& t = (*out)[k];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab_size)
      return fmt::format(
          "field 'output_token_ids': expected token ids below {}, found {} at index {}", vocab_size,
          t.dump(), k);
    if (k + 1 < out->size() && stops(t.get<int64_t>()))
      return fmt::format("field 'output_token_ids': stop id {} at index {} is not the last token",
                         t.get<int64_t>(), k);
  }
  const auto fr = j.find("finish_reason");
  const bool last_stops = !out->empty() && stops(out->back().get<int64_t>());
  if (fr == j.end() || !fr->is_string() || (*fr != "stop" && *fr != "length"))
    return "field 'finish_reason': expected \"stop\" or \"length\"";
  if ((*fr == "stop") != last_stops)
    return fmt::format("field 'finish_reason': {} does not match the last token", fr->dump());
  const auto margins = j.find("top1_margin");
  if (settings.value("margins", false) != (margins != j.end()))
    return "field 'top1_margin': present where the run's --margins setting is off, or missing";
  if (margins != j.end() && (!margins->is_array() || margins->size() != out->size()))
    return "field 'top1_margin': expected one margin per output token";
  const auto logprobs = j.find("logprobs");
  if ((settings.value("logprobs", 0) > 0) != (logprobs != j.end()))
    return "field 'logprobs': present where the run's --logprobs setting is 0, or missing";
  if (logprobs != j.end() && (!logprobs->is_array() || logprobs->size() != out->size()))
    return "field 'logprobs': expected one entry per output token";
  return {};
}

ResumePoint check_resume(const ResumeSource& source, const nlohmann::json& meta,
                         const std::vector<PromptLine>& lines, const std::string& batch,
                         int64_t vocab_size) {
  nlohmann::json old =
      nlohmann::json::parse(read_file_text(source.meta, "the run header"), nullptr, false);
  if (old.is_discarded() || !old.is_object())
    fail("{}: cannot resume: the run header is missing or malformed", source.meta);
  if (at(old, "/pack/digest") != meta["pack"]["digest"]) {
    fail("{}: cannot resume: the results were made with pack digest {}, this pack has {}",
         source.meta, at(old, "/pack/digest").dump(), meta["pack"]["digest"].dump());
  }
  for (const char* key : kResultSettings) {
    const nlohmann::json was = at(old, std::string("/settings/") + key);
    nlohmann::json now = meta["settings"].value(key, nlohmann::json());
    // note: a header without allow_unknown_fields or logprobs predates the
    // flag, which was then off.
    if (was.is_null() && (now == false || now == 0)) continue;
    // (nor tensor_parallel, which was recorded only above 1)
    if (was.is_null() && std::string_view(key) == "tensor_parallel" && now == 1) continue;
    // note: a template is the same template by its XXH64, whatever path
    // named it (a requeued job may run from another directory).
    if (std::string(key) == "chat_template" && was.is_object() && now.is_object() &&
        was.value("xxh64", "") == now.value("xxh64", ""))
      continue;
    if (was != now) {
      fail("{}: cannot resume: setting '{}' was {}, now {} (it changes the results)", source.meta,
           key, json_file_text(was, -1), json_file_text(now, -1));
    }
  }
  check_same_tuning(old, meta, source.meta);
  check_same_prompts(old, meta, source.meta, batch);
  ResumePoint rp;
  if (const nlohmann::json was = at(old, "/resumed_from"); was.is_array()) rp.earlier = was;
  nlohmann::json entry = nlohmann::json::object();
  for (const char* key : {"status", "settings", "stats", "error"})
    if (old.contains(key)) entry[key] = old[key];
  rp.earlier.push_back(std::move(entry));

  const std::string existing = read_file_text(source.path, "the results");
  // note: a complete run's header holds its results' XXH64 (headers made by
  // an older qtk do not); a results file changed since is not resumed over.
  if (const nlohmann::json digest = at(old, "/results_xxh64");
      digest.is_string() && at(old, "/status") == "complete") {
    const std::string now = results_digest(existing);
    if (now != digest.get<std::string>())
      fail(
          "{}: cannot resume: its XXH64 is {}, but its run header {} says {} (the file was "
          "changed after the run completed); start over with --force",
          source.path, now, source.meta, digest.get<std::string>());
  }
  const size_t last_newline = existing.rfind('\n');
  const size_t keep = last_newline == std::string::npos ? 0 : last_newline + 1;
  // note: generate never writes a raw carriage return (JSON escapes it in a
  // string): a line ending in CRLF was re-saved by an editor, and keeping it
  // would make the finished file differ from one run's.
  if (const size_t cr = std::string_view(existing).substr(0, keep).find('\r');
      cr != std::string_view::npos) {
    fail(
        "{}: cannot resume: line {} holds a carriage return (CRLF line ends?), which generate "
        "never writes; the file was edited: start over with --force",
        source.path, std::count(existing.begin(), existing.begin() + cr, '\n') + 1);
  }
  const auto done_lines = split_lines(std::string_view(existing).substr(0, keep));
  if (done_lines.size() > lines.size()) {
    fail("{}: cannot resume: it has {} lines but {} has only {}", source.path, done_lines.size(),
         batch, lines.size());
  }
  for (size_t i = 0; i < done_lines.size(); ++i) {
    nlohmann::json j = nlohmann::json::parse(done_lines[i], nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("id") || j["id"] != lines[i].id) {
      fail("{}: cannot resume: line {} is not the result of {} line {} (id {})", source.path, i + 1,
           batch, lines[i].line_no, lines[i].id.dump());
    }
    // note: a done line is an error line exactly where this run gives its
    // input line one (malformed, an unknown token, too long: all decided
    // before the run), with the same message; a result line edited into an
    // error (or back) would otherwise be kept, and miscounted.
    const bool done_error = j.contains("error");
    // note: an error line the run itself gave (non-finite logits) stands for
    // a valid input line: the same arithmetic would give it again.
    if (done_error && lines[i].error.empty() && j["error"].is_string() &&
        j["error"].get_ref<const std::string&>().starts_with(
            fmt::format("line {}: {}", lines[i].line_no, kNonFiniteLogits))) {
      ++rp.run_error_lines;
      continue;
    }
    // note: a line whose request could not fit an explicit --kv-cache-blocks
    // is an error line of that cache size (scheduler.cpp): a resume with a
    // cache that fits it would give a result, which a kept prefix cannot.
    if (done_error && lines[i].error.empty() && j["error"].is_string() &&
        j["error"].get_ref<const std::string&>().ends_with(kKvCacheTooSmall))
      fail(
          "{}: cannot resume: line {} is an error line because its request did not fit the KV "
          "cache of the earlier run (--kv-cache-blocks {}), but it fits this run's; resume with "
          "--kv-cache-blocks {}, or start over with --force to compute it",
          source.path, i + 1, at(old, "/settings/kv_cache_blocks_flag").dump(),
          at(old, "/settings/kv_cache_blocks_flag").dump());
    if (done_error != !lines[i].error.empty() || (done_error && j["error"] != lines[i].error)) {
      fail(
          "{}: cannot resume: line {} is {}, but this run gives {} line {} (id {}) {} (the "
          "results file was edited, or made by another build); start over with --force",
          source.path, i + 1, done_error ? "an error line" : "a result", batch, lines[i].line_no,
          lines[i].id.dump(),
          lines[i].error.empty() ? std::string("a result")
                                 : fmt::format("the error \"{}\"", lines[i].error));
    }
    // note: a kept line goes into the final results as it is: it must be a
    // result line this run could have written (a partial file edited by hand
    // would otherwise end in a file marked complete).
    if (!done_error) {
      if (const std::string why =
              not_a_result_line(j, lines[i].request, meta["settings"], vocab_size);
          !why.empty())
        fail(
            "{}: cannot resume: line {} (id {}, {} line {}) is not a result line of generate: {}; "
            "the file was edited: start over with --force",
            source.path, i + 1, lines[i].id.dump(), batch, lines[i].line_no, why);
    }
    // note: the prompt a result line records must be the one its input line
    // gives now (a partial file edited, or copied from another run, would
    // otherwise pass into the final results).
    if (lines[i].error.empty() && j.contains("prompt_token_ids")) {
      const nlohmann::json& p = j["prompt_token_ids"];
      const auto& want = lines[i].request.prompt;
      bool same = p.is_array() && p.size() == want.size();
      for (size_t k = 0; same && k < want.size(); ++k) same = p[k] == want[k];
      if (!same)
        fail(
            "{}: cannot resume: line {} records other prompt_token_ids than {} line {} gives (id "
            "{}; the results file was edited, or is another run's)",
            source.path, i + 1, batch, lines[i].line_no, lines[i].id.dump());
    }
    if (!done_error) {
      rp.kept_prompt_tokens += static_cast<int64_t>(lines[i].request.prompt.size());
      rp.kept_generated_tokens += static_cast<int64_t>(j["output_token_ids"].size());
    }
  }
  rp.lines_done = done_lines.size();
  rp.keep_bytes = keep;
  return rp;
}

}  // namespace qtk
