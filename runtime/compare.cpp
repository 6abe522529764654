#include "runtime/compare.h"

#include <cstdint>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "core/read_file.h"

namespace qtk {

namespace {

// What a field holds, for a message: its value if a number, else its type
// ("none" when absent).
std::string found(const nlohmann::json* v) {
  if (v == nullptr) return "none";
  return v->is_number() ? v->dump() : std::string(v->type_name());
}

std::vector<int32_t> read_token_ids(const nlohmann::json& j, const char* field,
                                    const std::string& where) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_array()) {
    fail("{}: field '{}': expected an array, found {}", where, field,
         found(it == j.end() ? nullptr : &*it));
  }
  std::vector<int32_t> ids;
  ids.reserve(it->size());
  for (const auto& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
      fail("{}: field '{}': expected token ids >= 0, found {}", where, field, found(&t));
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

// The first position where two prompts differ, in words.
std::string prompt_difference(const std::vector<int32_t>& x, const std::vector<int32_t>& a) {
  size_t k = 0;
  while (k < x.size() && k < a.size() && x[k] == a[k]) ++k;
  if (k < x.size() && k < a.size())
    return fmt::format("at position {}: expected token {}, got {}", k, x[k], a[k]);
  return fmt::format("in length: expected {} prompt tokens, got {}", x.size(), a.size());
}

// Each id once, in the order of its first line, standing for its result
// when it has one (else its first error line).
std::vector<const CompareCase*> one_case_per_id(const std::vector<CompareCase>& cases) {
  std::vector<const CompareCase*> order;
  std::unordered_map<std::string, size_t> at;
  for (const CompareCase& c : cases) {
    auto [it, fresh] = at.emplace(c.id, order.size());
    if (fresh) {
      order.push_back(&c);
    } else if (!order[it->second]->error.empty() && c.error.empty()) {
      order[it->second] = &c;
    }
  }
  return order;
}

CompareCase read_case(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail("{}: expected a JSON object, found {}", where, j.type_name());
  CompareCase c;
  auto id = j.find("id");
  if (id == j.end() || !(id->is_string() || id->is_number_integer())) {
    fail("{}: field 'id': expected a string or an integer, found {}", where,
         found(id == j.end() ? nullptr : &*id));
  }
  c.id = id->dump();
  if (auto e = j.find("error"); e != j.end()) {
    if (!e->is_string()) fail("{}: field 'error': expected a string, found {}", where, found(&*e));
    if (j.contains("output_token_ids"))
      fail("{}: an error line with output_token_ids (generate writes one or the other)", where);
    c.error = e->get<std::string>();
    return c;
  }
  c.tokens = read_token_ids(j, "output_token_ids", where);
  if (j.contains("prompt_token_ids")) {
    c.prompt = read_token_ids(j, "prompt_token_ids", where);
    c.has_prompt = true;
  }
  // note: a margin decides whether a divergence is excused, so a malformed
  // one is refused rather than read as 0 (a near-tie) or skipped: each is
  // logit(top1) - logit(top2) >= 0, one per output token.
  if (auto m = j.find("top1_margin"); m != j.end()) {
    if (!m->is_array())
      fail("{}: field 'top1_margin': expected an array, found {}", where, m->type_name());
    for (size_t i = 0; i < m->size(); ++i) {
      const auto& v = (*m)[i];
      if (!v.is_number() || !(v.get<double>() >= 0.0))
        fail("{}: field 'top1_margin': expected margins >= 0, found {} at index {}", where,
             found(&v), i);
      c.margins.push_back(v.get<double>());
    }
    if (c.margins.size() != c.tokens.size())
      fail("{}: field 'top1_margin': expected one margin per output token ({}), found {}", where,
           c.tokens.size(), c.margins.size());
  }
  return c;
}

// note: one result per id. A batch that reuses an id gets an error line
// for the reuse (generate), so an id may also have error lines; two
// results for one id would make the comparison depend on which is read.
// first_use: each id's first result, by its place ("line 3", "cases[2]").
void refuse_second_result(const CompareCase& c, const std::string& path, const std::string& place,
                          std::unordered_map<std::string, std::string>& first_use) {
  if (!c.error.empty()) return;
  auto [it, fresh] = first_use.emplace(c.id, place);
  if (!fresh)
    fail("{}: {}: id {}: expected one result per id, found a second one (the first at {})", path,
         place, c.id, it->second);
}

}  // namespace

std::vector<CompareCase> read_compare_file(const std::string& path) {
  const std::string text = read_file_text(path, "a results file or a golden.json");
  std::vector<CompareCase> cases;
  // A fixtures golden.json is one object with "cases"; results are JSONL.
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
    if (!doc.is_discarded() && doc.is_object() && doc.contains("cases")) {
      if (!doc["cases"].is_array()) fail("{}: field 'cases': expected an array", path);
      std::unordered_map<std::string, std::string> first_use;
      for (size_t i = 0; i < doc["cases"].size(); ++i) {
        const std::string place = fmt::format("cases[{}]", i);
        cases.push_back(read_case(doc["cases"][i], path + ": " + place));
        refuse_second_result(cases.back(), path, place, first_use);
      }
      return cases;
    }
  }
  std::istringstream lines(text);
  std::string line;
  int64_t n = 0;
  std::unordered_map<std::string, std::string> first_use;
  while (std::getline(lines, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string place = fmt::format("line {}", n);
    // note: generate's JSON reader (its messages, duplicate keys refused).
    const nlohmann::json j = parse_json_strict(line, path + ": " + place);
    cases.push_back(read_case(j, path + ": " + place));
    refuse_second_result(cases.back(), path, place, first_use);
  }
  if (cases.empty())
    fail("{}: expected result lines or a golden.json, found {}", path,
         text.empty() ? "an empty file" : "blank lines only");
  return cases;
}

CompareReport compare_cases(const std::vector<CompareCase>& expected,
                            const std::vector<CompareCase>& actual, double near_tie,
                            bool only_present) {
  CompareReport rep;
  std::unordered_map<std::string, const CompareCase*> by_id;
  for (const CompareCase* a : one_case_per_id(actual)) by_id.emplace(a->id, a);
  std::unordered_map<std::string, bool> seen;
  for (const CompareCase* ep : one_case_per_id(expected)) {
    const CompareCase& e = *ep;
    seen[e.id] = true;
    CaseReport r;
    r.id = e.id;
    auto it = by_id.find(e.id);
    if (it == by_id.end() && only_present) {
      ++rep.skipped;
      continue;
    }
    if (it == by_id.end()) {
      r.verdict = CaseVerdict::kMissing;
      r.detail = "missing from the actual file";
      ++rep.missing;
    } else if (!e.error.empty() && !it->second->error.empty()) {
      // note: a golden file keeps the error lines of its batch (a prompt
      // over the context, an unknown token): the same error again is the
      // same outcome; another error is not.
      if (e.error == it->second->error) {
        r.verdict = CaseVerdict::kIdentical;
        r.detail = "identical (an error line in both: " + e.error + ")";
        ++rep.identical;
      } else {
        r.verdict = CaseVerdict::kError;
        r.detail = fmt::format("error lines differ: expected \"{}\", got \"{}\"", e.error,
                               it->second->error);
        ++rep.errors;
      }
    } else if (!e.error.empty()) {
      r.verdict = CaseVerdict::kError;
      r.detail =
          "error in the expected file (no expected tokens), a result in the actual one: " + e.error;
      ++rep.errors;
    } else if (!it->second->error.empty()) {
      r.verdict = CaseVerdict::kError;
      r.detail = "error: " + it->second->error;
      ++rep.errors;
    } else if (e.has_prompt && it->second->has_prompt && e.prompt != it->second->prompt) {
      // note: the tokens of two different prompts are not comparable;
      // calling this a divergence would send the user after a model bug.
      r.verdict = CaseVerdict::kOtherPrompt;
      r.detail = "OTHER PROMPT: prompt_token_ids differ " +
                 prompt_difference(e.prompt, it->second->prompt) +
                 " (a different prompts file for this id?)";
      ++rep.other_prompt;
    } else {
      const auto& a = it->second->tokens;
      const auto& x = e.tokens;
      size_t k = 0;
      while (k < a.size() && k < x.size() && a[k] == x[k]) ++k;
      for (size_t i = 0; i < e.margins.size(); ++i) {
        if (e.margins[i] < near_tie) {
          r.near_tie_step = static_cast<int64_t>(i);
          break;
        }
      }
      if (k == a.size() && k == x.size()) {
        r.verdict = CaseVerdict::kIdentical;
        r.detail = fmt::format("identical ({} tokens)", x.size());
        ++rep.identical;
      } else {
        r.step = static_cast<int64_t>(k);
        std::string what = k < a.size() && k < x.size()
                               ? fmt::format("expected {}, got {}", x[k], a[k])
                               : fmt::format("expected {} tokens, got {}", x.size(), a.size());
        // note: a near-tie excuses tokens that differ, never a length: one
        // file's tokens ending where the other's go on (both the same up to
        // there) comes from another budget or stop id, not from a flip,
        // which would show as a different token at step k (a stop token is
        // part of the output).
        const bool tokens_differ = k < a.size() && k < x.size();
        if (tokens_differ && r.near_tie_step >= 0 && r.near_tie_step <= r.step) {
          r.verdict = CaseVerdict::kNearTie;
          r.detail = fmt::format(
              "near-tie: diverged at step {} ({}) after a near-tie at step {} "
              "(expected margin {:.3g} < {:g})",
              k, what, r.near_tie_step, e.margins[r.near_tie_step], near_tie);
          ++rep.near_tie;
        } else {
          r.verdict = CaseVerdict::kDiverged;
          r.detail = fmt::format("DIVERGED at step {}: {}", k, what);
          if (k < e.margins.size())
            r.detail += fmt::format(" (expected margin {:.3g})", e.margins[k]);
          ++rep.diverged;
        }
      }
    }
    rep.cases.push_back(std::move(r));
  }
  for (const CompareCase* a : one_case_per_id(actual)) {
    if (!seen.count(a->id)) rep.extra_ids.push_back(a->id);
  }
  return rep;
}

}  // namespace qtk
