// The scheduler against a fake model that records every step: budgets are
// respected, prefill is chunked, sequences join as soon as others finish,
// and preemption frees blocks and later recomputes.
#include <algorithm>
#include <cmath>
#include <deque>

#include <fmt/format.h>

#include "kernels/argmax.h"
#include "runtime/kv_cache.h"
#include "runtime/scheduler.h"
#include "tests/runtime/test_util.h"

namespace qtk::rt_test {
namespace {

// Next token = (last token + 1) % vocab, with the margin 1.
class FakeModel : public Model {
 public:
  FakeModel() {
    cfg_.vocab_size = 50;
    cfg_.num_layers = 1;
    cfg_.max_position_embeddings = 4096;
  }
  const ModelConfig& config() const override { return cfg_; }
  CacheSpec cache_spec() const override { return CacheSpec{1, 1, 1, 0}; }
  void reserve(int64_t, int64_t, int64_t) override {}
  void forward(const StepBatch& b, KvCache& kv, StatePool&, float* logits) override {
    steps.push_back({b.num_seqs, b.num_tokens});
    int64_t r = 0;
    for (int64_t s = 0; s < b.num_seqs; ++s) {
      // Every slot written this step must belong to the sequence's blocks.
      for (int32_t t = b.q_start[s]; t < b.q_start[s + 1]; ++t) {
        const int64_t block = b.slot_mapping[t] / kv.block_size();
        const int32_t* table = b.block_table + s * b.max_blocks;
        const int64_t pos = b.seq_len[s] - (b.q_start[s + 1] - t);
        EXPECT_EQ(table[pos / kv.block_size()], block);
        EXPECT_EQ(b.positions[t], pos);
      }
      if (!b.want_logits[s]) continue;
      float* row = logits + r++ * cfg_.vocab_size;
      std::fill(row, row + cfg_.vocab_size, 0.0f);
      const int32_t last = b.token_ids[b.q_start[s + 1] - 1];
      row[(last + 1) % cfg_.vocab_size] = 1.0f;
      // After the poisoned token: a NaN beside the winner, or (odd tokens)
      // an infinity.
      if (last == poison) row[(last + 7) % cfg_.vocab_size] = last % 2 ? INFINITY : NAN;
    }
    EXPECT_EQ(r, b.num_logits);
  }
  std::vector<std::pair<int64_t, int64_t>> steps;  // (seqs, tokens)
  int32_t poison = -1;  // the token after which a row holds a non-finite logit

 private:
  ModelConfig cfg_;
};

// Scheduler options: sequences, token budget, block size, blocks, context.
SchedulerOptions options(int64_t seqs, int64_t tokens, int64_t block_size, int64_t blocks,
                         int64_t context) {
  SchedulerOptions o;
  o.max_num_seqs = seqs;
  o.max_batched_tokens = tokens;
  o.block_size = block_size;
  o.num_blocks = blocks;
  o.max_context = context;
  return o;
}

SequenceRequest req(int len, int max_tokens, int first = 0) {
  SequenceRequest r;
  for (int i = 0; i < len; ++i) r.prompt.push_back((first + i) % 50);
  r.max_tokens = max_tokens;
  return r;
}

std::vector<SequenceResult> run_all(Scheduler& s, int n) {
  std::vector<SequenceResult> out(n);
  std::vector<int64_t> fin;
  int guard = 0;
  while (s.has_work() && guard++ < 100000) {
    fin.clear();
    s.step(fin);
    for (int64_t h : fin) out[h] = s.take_result(h);
  }
  return out;
}

TEST(Scheduler, RespectsBudgetsAndChunksPrefill) {
  FakeModel m;
  const SchedulerOptions o = options(3, 7, 4, 64, 200);
  Scheduler s(m, o);
  for (int i = 0; i < 8; ++i) s.add(req(5 + 3 * i, 4, i));
  auto res = run_all(s, 8);
  for (const auto& [seqs, tokens] : m.steps) {
    EXPECT_LE(seqs, 3);
    EXPECT_LE(tokens, 7);
  }
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(res[i].output.size(), 4u);
    // Continues the prompt's count: last prompt token + 1, + 2, ...
    const int last = (i + 5 + 3 * i - 1) % 50;
    for (int k = 0; k < 4; ++k) EXPECT_EQ(res[i].output[k], (last + 1 + k) % 50);
  }
  EXPECT_EQ(s.stats().preemptions, 0);
  EXPECT_EQ(s.stats().generated_tokens, 32);
}

TEST(Scheduler, NewSequenceJoinsWhenOneFinishes) {
  FakeModel m;
  const SchedulerOptions o = options(2, 64, 16, 64, 200);
  Scheduler s(m, o);
  s.add(req(3, 2));  // finishes after 2 steps
  s.add(req(3, 10));
  s.add(req(3, 2));  // joins in step 3
  std::vector<int64_t> fin;
  s.step(fin);  // prefill 0 and 1
  EXPECT_EQ(m.steps.back(), (std::pair<int64_t, int64_t>(2, 6)));
  s.step(fin);  // decode 0 (finishes), 1
  EXPECT_EQ(fin, std::vector<int64_t>{0});
  s.step(fin);  // decode 1 + prefill 2
  EXPECT_EQ(m.steps.back(), (std::pair<int64_t, int64_t>(2, 4)));
}

// FakeModel with pipelined greedy steps, as the GPU backend gives them:
// greedy_submit computes the step at once and queues its ids; a fed token
// (StepBatch::feed) takes the id of that row of the step submitted just
// before, whose result the scheduler has not collected yet.
class PipelinedFake : public FakeModel {
 public:
  bool greedy_submit(const StepBatch& b, KvCache& kv, StatePool& states) override {
    EXPECT_LT(queued_.size(), 2u) << "more than two steps queued";
    std::vector<int32_t> ids(b.token_ids, b.token_ids + b.num_tokens);
    if (b.feed != nullptr) {
      ++fed_steps;
      for (int64_t t = 0; t < b.num_tokens; ++t) {
        if (b.feed[t] < 0) continue;
        EXPECT_LT(b.feed[t], static_cast<int32_t>(last_.size()));
        ids[t] = last_.at(b.feed[t]);
        ++fed_tokens;
      }
    }
    StepBatch c = b;
    c.token_ids = ids.data();
    c.feed = nullptr;
    const int64_t vocab = config().vocab_size;
    std::vector<float> logits(b.num_logits * vocab);
    forward(c, kv, states, logits.data());
    Result r;
    r.ids.resize(b.num_logits);
    r.margins.resize(b.num_logits);
    argmax_rows(logits.data(), b.num_logits, vocab, r.ids.data(), r.margins.data());
    last_ = r.ids;
    queued_.push_back(std::move(r));
    return true;
  }
  void greedy_collect(int32_t* ids, float* margins) override {
    ASSERT_FALSE(queued_.empty());
    const Result r = std::move(queued_.front());
    queued_.pop_front();
    std::copy(r.ids.begin(), r.ids.end(), ids);
    std::copy(r.margins.begin(), r.margins.end(), margins);
  }
  int64_t fed_steps = 0, fed_tokens = 0;

 private:
  struct Result {
    std::vector<int32_t> ids;
    std::vector<float> margins;
  };
  std::deque<Result> queued_;
  std::vector<int32_t> last_;
};

// The same requests through the pipelined and the step-by-step scheduler
// give the same results: budgets, chunked prefill, sequences that stop on a
// token the next step was already built on (its extra row dropped), the
// length limit, and preemption (which first takes every queued result).
TEST(Scheduler, PipelinedStepsGiveTheSameResults) {
  struct Case {
    SchedulerOptions o;
    int n;
  };
  const std::vector<Case> cases = {
      {options(3, 7, 4, 64, 200), 8},
      {options(4, 16, 2, 10, 200), 4},
      {options(2, 64, 16, 64, 200), 5},
      {options(8, 512, 4, 64, 15), 6}};  // the context ends before max_tokens
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    auto requests = [&] {
      std::vector<SequenceRequest> rs;
      for (int i = 0; i < k.n; ++i) {
        const int len = 5 + (i % 2);
        SequenceRequest r = req(len, 12, 10 * i);
        // Every other sequence stops on its 3rd or 5th token (output k is
        // the last prompt token + 1 + k).
        if (i % 2 == 1) r.stop_ids = {(10 * i + len - 1 + (i % 4 == 1 ? 3 : 5)) % 50};
        rs.push_back(r);
      }
      return rs;
    };
    FakeModel plain;
    PipelinedFake piped;
    Scheduler a(plain, k.o), b(piped, k.o);
    for (const auto& r : requests()) {
      ASSERT_EQ(a.check_fits(r), "") << "case " << c;
      a.add(r);
      b.add(r);
    }
    const auto ra = run_all(a, k.n), rb = run_all(b, k.n);
    int stopped = 0;
    for (const auto& r : ra) stopped += r.stopped;
    EXPECT_GT(stopped, 0) << "case " << c << ": no sequence stopped on a token";
    for (int i = 0; i < k.n; ++i) {
      EXPECT_EQ(ra[i].output, rb[i].output) << "case " << c << " sequence " << i;
      EXPECT_EQ(ra[i].margins, rb[i].margins) << "case " << c << " sequence " << i;
      EXPECT_EQ(ra[i].stopped, rb[i].stopped) << "case " << c << " sequence " << i;
      EXPECT_FALSE(ra[i].output.empty());
    }
    EXPECT_EQ(a.stats().generated_tokens, b.stats().generated_tokens) << "case " << c;
    EXPECT_GT(piped.fed_steps, 0) << "case " << c << ": no step was built on a queued result";
    if (c == 1) {
      EXPECT_GT(a.stats().preemptions, 0);
      EXPECT_GT(b.stats().preemptions, 0);
    }
  }
}

// A row of logits with a NaN or an infinity ends its sequence with an error
// (no greedy token is defined) and the tokens before it; the other sequences
// run on unchanged, step by step and pipelined alike, and the cache is whole
// again at the end.
TEST(Scheduler, NonFiniteLogitsEndTheirSequenceWithAnError) {
  for (const int32_t poison : {20, 25}) {  // NaN, infinity
    auto run = [&](FakeModel& m) {
      m.poison = poison;
      Scheduler s(m, options(3, 9, 4, 40, 200));
      // Sequence i counts on from 10 i + 5; those passing the poison stop there.
      for (int i = 0; i < 6; ++i) s.add(req(6, 10, 10 * i));
      auto res = run_all(s, 6);
      // 20: sequence 1 (outputs 16, 17, ...) stops after 5 tokens; 25: sequence
      // 2 (its prompt ends on 25) gets none, and sequence 1's 10th output is
      // 25, whose row no step computes.
      EXPECT_EQ(s.stats().generated_tokens, poison == 20 ? 55 : 50);
      EXPECT_EQ(s.stats().preemptions, 0);
      return res;
    };
    FakeModel plain;
    PipelinedFake piped;
    const auto ra = run(plain), rb = run(piped);
    for (int i = 0; i < 6; ++i) {
      const int first = (10 * i + 5 + 1) % 50;  // the first output token
      // Output k is first + k: the poisoned row follows the output token poison.
      int poisoned_at = -1;
      for (int k = 0; k + 1 < 10 && poisoned_at < 0; ++k)
        if ((first + k) % 50 == poison) poisoned_at = k + 1;
      if ((10 * i + 5) % 50 == poison) poisoned_at = 0;  // the prompt's last token
      for (const auto* r : {&ra[i], &rb[i]}) {
        if (poisoned_at < 0) {
          EXPECT_EQ(r->error, "") << "sequence " << i;
          EXPECT_EQ(r->output.size(), 10u) << "sequence " << i;
        } else {
          EXPECT_TRUE(r->error.starts_with(kNonFiniteLogits)) << r->error;
          EXPECT_NE(r->error.find(fmt::format("output token {} ", poisoned_at + 1)),
                    std::string::npos)
              << r->error;
          EXPECT_EQ(r->output.size(), static_cast<size_t>(poisoned_at)) << "sequence " << i;
        }
      }
      EXPECT_EQ(ra[i].output, rb[i].output) << "sequence " << i;
      EXPECT_EQ(ra[i].error, rb[i].error) << "sequence " << i;
    }
  }
}

// A long decode beside a long prompt on a cache that holds the decode and
// the prompt's first chunks but not both whole: the prompt is preempted once
// and waits for the decode to finish, instead of being re-admitted at once
// and preempted again at each of the decode's new blocks (it was preempted
// 64 times here, 9,262 prompt tokens recomputed).
TEST(Scheduler, APreemptedSequenceIsNotReadmittedUntilOneFinishes) {
  FakeModel m;
  // 100 blocks of 4: the decode's 40 + 300 tokens end at 85 blocks, the
  // prompt needs 91 of its own.
  Scheduler s(m, options(4, 32, 4, 100, 1000));
  s.add(req(40, 300, 0));
  s.add(req(360, 1, 7));
  const auto res = run_all(s, 2);
  ASSERT_EQ(res[0].output.size(), 300u);
  ASSERT_EQ(res[1].output.size(), 1u);
  EXPECT_EQ(res[1].output[0], (7 + 360) % 50);
  EXPECT_LE(s.stats().preemptions, 1);
  EXPECT_LE(s.stats().recomputed_tokens, 360);
}

TEST(Scheduler, PreemptsWhenBlocksRunOutAndRecomputes) {
  FakeModel m;
  const SchedulerOptions o =
      options(4, 16, 2, 10, 200);  // 20 tokens: one sequence of 6 + 12 fits alone
  Scheduler s(m, o);
  for (int i = 0; i < 4; ++i) {
    auto r = req(6, 12, 10 * i);
    EXPECT_EQ(s.check_fits(r), "");
    s.add(r);
  }
  auto res = run_all(s, 4);
  EXPECT_GT(s.stats().preemptions, 0);
  EXPECT_GT(s.stats().recomputed_tokens, 0);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(res[i].output.size(), 12u);
    for (int k = 0; k < 12; ++k) EXPECT_EQ(res[i].output[k], (10 * i + 6 + k) % 50);
  }
  // A prompt that can never fit is refused up front.
  EXPECT_NE(s.check_fits(req(20, 5)).find("KV blocks"), std::string::npos);
}

// ---- prefill alignment ------------------------------------------------------

// A model with a prefill alignment. Token ids encode (sequence, position):
// sequence i's prompt token at position j is i*500 + j, and the next token is
// last + 1, so every token id of sequence i is i*500 + its position. Records
// each sequence's run per step: [first position, end) and aligned_tokens.
class AlignedFakeModel : public Model {
 public:
  explicit AlignedFakeModel(int64_t align) : align_(align) {
    cfg_.vocab_size = 4096;
    cfg_.num_layers = 1;
    cfg_.max_position_embeddings = 4096;
  }
  const ModelConfig& config() const override { return cfg_; }
  CacheSpec cache_spec() const override { return CacheSpec{1, 1, 1, 0}; }
  int64_t prefill_alignment() const override { return align_; }
  void reserve(int64_t max_tokens, int64_t, int64_t) override { reserved_tokens = max_tokens; }
  void forward(const StepBatch& b, KvCache&, StatePool&, float* logits) override {
    steps.push_back(b.num_tokens);
    if (align_ > 1) {
      EXPECT_NE(b.aligned_tokens, nullptr);
    } else {
      EXPECT_EQ(b.aligned_tokens, nullptr);
    }
    int64_t r = 0;
    for (int64_t s = 0; s < b.num_seqs; ++s) {
      Run run;
      const int32_t first = b.token_ids[b.q_start[s]];
      run.seq = first / 500;
      run.begin = b.seq_len[s] - (b.q_start[s + 1] - b.q_start[s]);
      run.end = b.seq_len[s];
      run.aligned = b.aligned_tokens ? b.aligned_tokens[s] : 0;
      for (int32_t t = b.q_start[s]; t < b.q_start[s + 1]; ++t)
        EXPECT_EQ(b.token_ids[t], run.seq * 500 + run.begin + (t - b.q_start[s]));
      runs.push_back(run);
      if (!b.want_logits[s]) continue;
      float* row = logits + r++ * cfg_.vocab_size;
      std::fill(row, row + cfg_.vocab_size, 0.0f);
      row[(b.token_ids[b.q_start[s + 1] - 1] + 1) % cfg_.vocab_size] = 1.0f;
    }
  }
  struct Run {
    int64_t seq, begin, end, aligned;
  };
  std::vector<Run> runs;
  std::vector<int64_t> steps;  // tokens per step
  int64_t reserved_tokens = 0;

 private:
  int64_t align_;
  ModelConfig cfg_;
};

SequenceRequest aligned_req(int seq, int len, int max_tokens) {
  SequenceRequest r;
  for (int j = 0; j < len; ++j) r.prompt.push_back(seq * 500 + j);
  r.max_tokens = max_tokens;
  return r;
}

// Checks every recorded run against the rule: a run that starts inside the
// prompt's full aligned chunks starts at a multiple of A and ends at one or
// at/after A*floor(L/A); aligned_tokens is exactly its part below that bound.
void expect_aligned_runs(const AlignedFakeModel& m, const std::vector<int>& lens, int64_t A) {
  for (const auto& r : m.runs) {
    ASSERT_LT(r.seq, static_cast<int64_t>(lens.size()));
    const int64_t end = lens[r.seq] / A * A;
    if (r.begin < end) {
      EXPECT_EQ(r.begin % A, 0) << "seq " << r.seq << " run [" << r.begin << ", " << r.end << ")";
      EXPECT_TRUE(r.end % A == 0 || r.end >= end)
          << "seq " << r.seq << " run [" << r.begin << ", " << r.end << ") splits an aligned chunk";
      EXPECT_EQ(r.aligned, std::min(r.end, end) - r.begin) << "seq " << r.seq;
    } else {
      EXPECT_EQ(r.aligned, 0) << "seq " << r.seq << " run [" << r.begin << ", " << r.end << ")";
    }
  }
}

void expect_outputs(const std::vector<SequenceResult>& res, const std::vector<int>& lens,
                    int max_tokens) {
  for (size_t i = 0; i < lens.size(); ++i) {
    ASSERT_EQ(res[i].output.size(), static_cast<size_t>(max_tokens)) << i;
    for (int k = 0; k < max_tokens; ++k)
      EXPECT_EQ(res[i].output[k], static_cast<int>(i) * 500 + lens[i] + k) << i;
  }
}

TEST(SchedulerAlignment, PrefillChunksEndOnAlignedPositions) {
  const int64_t A = 8;
  AlignedFakeModel m(A);
  const SchedulerOptions o = options(3, 20, 4, 256, 400);
  Scheduler s(m, o);
  const std::vector<int> lens = {3, 8, 17, 40, 64, 5, 23, 9};
  for (size_t i = 0; i < lens.size(); ++i) s.add(aligned_req(static_cast<int>(i), lens[i], 6));
  expect_outputs(run_all(s, static_cast<int>(lens.size())), lens, 6);
  expect_aligned_runs(m, lens, A);
  for (int64_t t : m.steps) EXPECT_LE(t, 20);
  EXPECT_EQ(m.reserved_tokens, 20);
  // The rule had something to do: some run was cut short of the budget.
  bool cut = false;
  for (const auto& r : m.runs)
    cut = cut || (r.aligned > 0 && r.end % A == 0 && r.end < lens[r.seq] / A * A);
  EXPECT_TRUE(cut);
}

TEST(SchedulerAlignment, BudgetBelowAlignmentIsRaisedForAlignedChunks) {
  const int64_t A = 16;
  AlignedFakeModel m(A);
  const SchedulerOptions o = options(4, 7, 5, 256, 400);
  Scheduler s(m, o);
  const std::vector<int> lens = {40, 2, 33, 16, 15};
  for (size_t i = 0; i < lens.size(); ++i) s.add(aligned_req(static_cast<int>(i), lens[i], 5));
  expect_outputs(run_all(s, static_cast<int>(lens.size())), lens, 5);
  expect_aligned_runs(m, lens, A);
  // note: at most budget - 1 other tokens plus one raised chunk of A.
  for (int64_t t : m.steps) EXPECT_LE(t, 7 + A - 1);
  EXPECT_EQ(m.reserved_tokens, 7 + A - 1);
  bool raised = false;
  for (const auto& r : m.runs) raised = raised || r.aligned == A;
  EXPECT_TRUE(raised);
  // Tails and generated tokens still follow the budget of 7.
  for (const auto& r : m.runs) {
    if (r.aligned == 0) {
      EXPECT_LE(r.end - r.begin, 7);
    }
  }
}

TEST(SchedulerAlignment, PreemptionReplaysPromptAlignedAndGeneratedTokensUnaligned) {
  const int64_t A = 4;
  AlignedFakeModel m(A);
  const SchedulerOptions o =
      options(4, 11, 2, 14, 200);  // 28 tokens: one sequence of 10 + 18 fits alone
  Scheduler s(m, o);
  const std::vector<int> lens = {10, 9, 6, 13};
  for (size_t i = 0; i < lens.size(); ++i) {
    auto r = aligned_req(static_cast<int>(i), lens[i], 14);
    ASSERT_EQ(s.check_fits(r), "");
    s.add(r);
  }
  expect_outputs(run_all(s, static_cast<int>(lens.size())), lens, 14);
  EXPECT_GT(s.stats().preemptions, 0);
  expect_aligned_runs(m, lens, A);
  // A replay covers generated tokens too; none of them counts as aligned.
  bool replayed_generated = false;
  for (const auto& r : m.runs) {
    if (r.aligned > 0) {
      EXPECT_LE(r.begin + r.aligned, lens[r.seq]);
    }
    replayed_generated = replayed_generated || (r.begin == 0 && r.end > lens[r.seq] + 1);
  }
  EXPECT_TRUE(replayed_generated);
}

TEST(SchedulerAlignment, AlignmentOneLeavesSchedulingUnchanged) {
  AlignedFakeModel m(1);
  const SchedulerOptions o = options(3, 7, 4, 64, 200);
  Scheduler s(m, o);
  const std::vector<int> lens = {20, 3, 9};
  for (size_t i = 0; i < lens.size(); ++i) s.add(aligned_req(static_cast<int>(i), lens[i], 4));
  expect_outputs(run_all(s, 3), lens, 4);
  // The first step fills the budget of 7 with the first prompt.
  ASSERT_FALSE(m.runs.empty());
  EXPECT_EQ(m.runs[0].end - m.runs[0].begin, 7);
  for (int64_t t : m.steps) EXPECT_LE(t, 7);
}

// A model that keeps its cache elsewhere (as the CUDA backend does): the
// scheduler gives it block and slot ids but allocates no host floats.
class DeviceCacheFakeModel : public FakeModel {
 public:
  CacheSpec cache_spec() const override { return CacheSpec{2, 4, 8, 100}; }
  bool uses_host_cache() const override { return false; }
  void forward(const StepBatch& b, KvCache& kv, StatePool& states, float* logits) override {
    EXPECT_EQ(kv.k(0), nullptr);
    EXPECT_EQ(kv.v(1), nullptr);
    for (int64_t s = 0; s < b.num_seqs; ++s) {
      ASSERT_GE(b.state_slot[s], 0);
      EXPECT_EQ(states.slot(b.state_slot[s]), nullptr);
    }
    FakeModel::forward(b, kv, states, logits);
  }
};

TEST(Scheduler, DeviceModelGetsBookkeepingWithoutHostStorage) {
  DeviceCacheFakeModel m;
  const SchedulerOptions o =
      options(2, 6, 4, 5, 200);  // small: forces preemption, which must work without storage too
  Scheduler s(m, o);
  for (int i = 0; i < 4; ++i) s.add(req(6, 5, i));
  const auto res = run_all(s, 4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(res[i].output.size(), 5u);
    for (int k = 0; k < 5; ++k) EXPECT_EQ(res[i].output[k], (i + 5 + 1 + k) % 50);
  }
}

TEST(KvCacheStorage, WithoutStorageOnlyBookkeeping) {
  const CacheSpec spec{3, 2, 16, 64};
  KvCache with(spec, 4, 8), without(spec, 4, 8, false);
  ASSERT_NE(with.k(2), nullptr);
  EXPECT_EQ(with.k(2) - with.k(0), 2 * 4 * 8 * 2 * 16);
  EXPECT_EQ(without.k(0), nullptr);
  EXPECT_EQ(without.v(2), nullptr);
  EXPECT_EQ(without.allocate(), 0);
  EXPECT_EQ(without.allocate(), 1);
  EXPECT_EQ(without.free_blocks(), 2);
  StatePool pool(64, 3), none(64, 3, false);
  const int32_t a = pool.acquire(), b = none.acquire();
  EXPECT_EQ(a, b);
  ASSERT_NE(pool.slot(a), nullptr);
  EXPECT_EQ(none.slot(b), nullptr);
  EXPECT_EQ(none.acquire(), 1);
  EXPECT_EQ(none.acquire(), 2);
  EXPECT_EQ(none.acquire(), -1);
}

}  // namespace
}  // namespace qtk::rt_test
