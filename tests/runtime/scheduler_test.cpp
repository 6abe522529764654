// The scheduler against a fake model that records every step: budgets are
// respected, prefill is chunked, sequences join as soon as others finish,
// and preemption frees blocks and later recomputes.
#include <algorithm>

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
      row[(b.token_ids[b.q_start[s + 1] - 1] + 1) % cfg_.vocab_size] = 1.0f;
    }
    EXPECT_EQ(r, b.num_logits);
  }
  std::vector<std::pair<int64_t, int64_t>> steps;  // (seqs, tokens)

 private:
  ModelConfig cfg_;
};

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
  SchedulerOptions o;
  o.max_num_seqs = 3;
  o.max_batched_tokens = 7;
  o.block_size = 4;
  o.num_blocks = 64;
  o.max_context = 200;
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
  SchedulerOptions o;
  o.max_num_seqs = 2;
  o.max_batched_tokens = 64;
  o.num_blocks = 64;
  o.max_context = 200;
  Scheduler s(m, o);
  s.add(req(3, 2));   // finishes after 2 steps
  s.add(req(3, 10));
  s.add(req(3, 2));   // joins in step 3
  std::vector<int64_t> fin;
  s.step(fin);  // prefill 0 and 1
  EXPECT_EQ(m.steps.back(), (std::pair<int64_t, int64_t>(2, 6)));
  s.step(fin);  // decode 0 (finishes), 1
  EXPECT_EQ(fin, std::vector<int64_t>{0});
  s.step(fin);  // decode 1 + prefill 2
  EXPECT_EQ(m.steps.back(), (std::pair<int64_t, int64_t>(2, 4)));
}

TEST(Scheduler, PreemptsWhenBlocksRunOutAndRecomputes) {
  FakeModel m;
  SchedulerOptions o;
  o.max_num_seqs = 4;
  o.max_batched_tokens = 16;
  o.block_size = 2;
  o.num_blocks = 10;  // 20 tokens: one sequence of 6 + 12 fits alone
  o.max_context = 200;
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

}  // namespace
}  // namespace qtk::rt_test
