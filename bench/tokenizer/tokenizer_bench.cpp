// Tokenizer speed: single-thread encoding of >= 1 MB of mixed text, batch
// encoding on several threads, decoding, and the load time of Qwen3's 11 MB
// tokenizer.json.
//
//   build-tok/bin/tokenizer_bench [--benchmark_filter=...] [--benchmark_format=json]
//
// Targets (issue 4): >= 1M tokens/s on one thread (HF tokenizers: ~470k),
// load < 150 ms.
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The project root; QTK_SOURCE_DIR in the environment overrides the build's
// (to run the binary on another machine with the repository elsewhere).
std::string source_dir() {
  const char* env = std::getenv("QTK_SOURCE_DIR");
  return env && *env ? env : QTK_SOURCE_DIR;
}

const std::string kQwen3Json = source_dir() + "/tests/data/tokenizer/qwen3/tokenizer.json";

const qtk::Tokenizer& qwen3() {
  static const qtk::Tokenizer tokenizer = qtk::Tokenizer::from_file(kQwen3Json);
  return tokenizer;
}

// Changes some words so that repeated documents are not all cache hits:
// a new suffix, different case or a number, as real text varies.
std::string vary(const std::string& text, std::mt19937& rng) {
  static const char* kSuffixes[] = {"s", "ed", "ing", "er", "_v2", "X", "ly", "2", "ness", "able"};
  std::uniform_int_distribution<int> coin(0, 99);
  std::uniform_int_distribution<int> number(0, 99999);
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    out.push_back(c);
    const bool word_end =
        ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) &&
        (i + 1 == text.size() || text[i + 1] == ' ' || text[i + 1] == '.' || text[i + 1] == ',');
    if (!word_end) continue;
    const int roll = coin(rng);
    if (roll < 8)
      out += kSuffixes[roll % 10];
    else if (roll < 10)
      out += std::to_string(number(rng));
  }
  return out;
}

// >= 1 MB of documents: the reference texts (prose, code, many scripts, emoji,
// chat markup), Python from the sample goldens, and English prose, repeated
// with variations.
const std::vector<std::string>& mixed_documents() {
  static const std::vector<std::string> docs = [] {
    std::vector<std::string> seeds;
    std::ifstream ref(source_dir() + "/tests/data/tokenizer/qwen3/reference_encodings.jsonl");
    for (std::string line; std::getline(ref, line);) {
      if (!line.empty()) seeds.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
    }
    for (const char* sample : {"qwen3-sample", "qwen3.5-sample"}) {
      const auto golden =
          nlohmann::json::parse(read_text(source_dir() + "/samples/" + sample + "/golden.json"));
      for (const auto& c : golden["cases"]) {
        seeds.push_back(c["prompt"].get<std::string>() + c["output_text"].get<std::string>());
      }
    }
    seeds.push_back(
        "The committee met on Tuesday to review the budget for the coming year. After a long "
        "discussion "
        "about priorities, the members agreed that maintenance of the existing roads should come "
        "first, "
        "followed by the new library wing and, if funds allow, the riverside park. Several "
        "residents spoke "
        "in favour of the park; others worried about the cost of upkeep. The chair promised a "
        "written "
        "summary within two weeks, and the vote was scheduled for the first meeting of next "
        "month.\n\n");
    std::mt19937 rng(2024);
    std::vector<std::string> out;
    size_t bytes = 0;
    while (bytes < (size_t{1} << 20) + (size_t{1} << 18)) {  // 1.25 MB
      for (const std::string& s : seeds) {
        out.push_back(vary(s, rng));
        bytes += out.back().size();
      }
    }
    return out;
  }();
  return docs;
}

void BM_LoadQwen3TokenizerJson(benchmark::State& state) {
  const std::string text = read_text(kQwen3Json);
  for (auto _ : state) {
    qtk::Tokenizer tokenizer = qtk::Tokenizer::from_json_text(text, kQwen3Json);
    benchmark::DoNotOptimize(tokenizer);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_LoadQwen3TokenizerJson)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5)
    ->Repetitions(3)
    ->ReportAggregatesOnly(false);

void BM_LoadQwen3FromFile(benchmark::State& state) {
  for (auto _ : state) {
    qtk::Tokenizer tokenizer = qtk::Tokenizer::from_file(kQwen3Json);
    benchmark::DoNotOptimize(tokenizer);
  }
}
BENCHMARK(BM_LoadQwen3FromFile)->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_EncodeMixedOneThread(benchmark::State& state) {
  const qtk::Tokenizer& tok = qwen3();
  const auto& docs = mixed_documents();
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  int64_t tokens = 0;
  for (auto _ : state) {
    tokens = 0;
    for (const std::string& d : docs) {
      const std::vector<int32_t> ids = tok.encode(d);
      tokens += static_cast<int64_t>(ids.size());
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetItemsProcessed(state.iterations() * tokens);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * tokens), benchmark::Counter::kIsRate);
  state.counters["MB_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * bytes) / 1e6, benchmark::Counter::kIsRate);
  state.counters["input_MB"] = static_cast<double>(bytes) / 1e6;
  state.counters["tokens"] = static_cast<double>(tokens);
}
BENCHMARK(BM_EncodeMixedOneThread)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// >= 1 MB of made-up words, numbers and punctuation where almost no word
// repeats: nearly every pre-token misses the word cache, so this measures
// the BPE merging itself (the worst case for the cache).
const std::string& unique_words_text() {
  static const std::string text = [] {
    static const char* kSyllables[] = {"ka",  "lo",  "mi", "tra", "ven", "sho", "qu",  "ber",
                                       "ist", "ond", "ex", "pli", "ga",  "rum", "zel", "ph",
                                       "ai",  "oo",  "nt", "str", "ic",  "al"};
    std::mt19937 rng(77);
    std::uniform_int_distribution<int> syllables(1, 5), pick(0, 21), roll(0, 99), number(0, 999999);
    std::string out;
    while (out.size() < (size_t{1} << 20) + (size_t{1} << 18)) {
      const int r = roll(rng);
      if (r < 80) {
        out += ' ';
        const int n = syllables(rng);
        for (int k = 0; k < n; ++k) out += kSyllables[pick(rng)];
        if (r < 8) out[out.size() - 1] = static_cast<char>('A' + r);
      } else if (r < 90) {
        out += ' ' + std::to_string(number(rng));
      } else if (r < 96) {
        out += ",.;:!?"[r - 90];
      } else {
        out += '\n';
      }
    }
    return out;
  }();
  return text;
}

void BM_EncodeUniqueWordsOneThread(benchmark::State& state) {
  const qtk::Tokenizer& tok = qwen3();
  const std::string& text = unique_words_text();
  int64_t tokens = 0;
  for (auto _ : state) {
    const std::vector<int32_t> ids = tok.encode(text);
    tokens = static_cast<int64_t>(ids.size());
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * tokens), benchmark::Counter::kIsRate);
  state.counters["MB_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * text.size()) / 1e6, benchmark::Counter::kIsRate);
  state.counters["input_MB"] = static_cast<double>(text.size()) / 1e6;
  state.counters["tokens"] = static_cast<double>(tokens);
}
BENCHMARK(BM_EncodeUniqueWordsOneThread)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_EncodeBatch(benchmark::State& state) {
  const qtk::Tokenizer& tok = qwen3();
  const auto& docs = mixed_documents();
  const int threads = static_cast<int>(state.range(0));
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  int64_t tokens = 0;
  for (auto _ : state) {
    const auto ids = tok.encode_batch(docs, threads);
    tokens = 0;
    for (const auto& v : ids) tokens += static_cast<int64_t>(v.size());
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * tokens), benchmark::Counter::kIsRate);
  state.counters["MB_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * bytes) / 1e6, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EncodeBatch)
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

void BM_DecodeMixed(benchmark::State& state) {
  const qtk::Tokenizer& tok = qwen3();
  std::vector<std::vector<int32_t>> encoded;
  int64_t tokens = 0;
  for (const auto& d : mixed_documents()) {
    encoded.push_back(tok.encode(d));
    tokens += static_cast<int64_t>(encoded.back().size());
  }
  for (auto _ : state) {
    for (const auto& ids : encoded) {
      std::string text = tok.decode(ids);
      benchmark::DoNotOptimize(text.data());
    }
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * tokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeMixed)->Unit(benchmark::kMillisecond)->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
