#include "runtime/scheduler.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "core/plural.h"
#include "core/tuning.h"
#include "kernels/argmax.h"
#include "runtime/logprobs.h"

namespace qtk {

Scheduler::Scheduler(Model& model, const SchedulerOptions& options)
    : model_(model),
      opt_(options),
      spec_(model.cache_spec()),
      kv_(spec_, options.num_blocks, options.block_size, model.uses_host_cache()),
      states_(spec_.state_floats, options.max_num_seqs, model.uses_host_cache()) {
  if (opt_.max_num_seqs < 1)
    fail("--max-num-seqs: expected at least 1, found {}", opt_.max_num_seqs);
  if (opt_.max_batched_tokens < 1) {
    fail("--max-batched-tokens: expected at least 1, found {}", opt_.max_batched_tokens);
  }
  if (opt_.max_context < 1)
    fail("scheduler: max_context must be positive, found {}", opt_.max_context);
  max_blocks_per_seq_ = std::min(opt_.num_blocks, blocks_for(opt_.max_context));
  align_ = model.prefill_alignment();
  if (align_ < 1) fail("scheduler: model prefill alignment must be positive, found {}", align_);
  // note: a budget below the alignment is raised to it for a sequence in its
  // aligned prefix, after up to budget - 1 other tokens of the same step.
  step_capacity_ = opt_.max_batched_tokens < align_ ? opt_.max_batched_tokens + align_ - 1
                                                    : opt_.max_batched_tokens;
  const int64_t T = step_capacity_;
  const int64_t S = opt_.max_num_seqs;
  token_ids_.resize(T);
  feed_.resize(T);
  pipeline_ = tuning().pipeline && opt_.logprobs == 0;
  positions_.resize(3 * T);
  slot_mapping_.resize(T);
  q_start_.resize(S + 1);
  seq_len_.resize(S);
  state_slot_.resize(S);
  aligned_tokens_.resize(S);
  want_logits_.resize(S);
  block_table_.resize(S * max_blocks_per_seq_);
  logits_.resize(S * model.config().vocab_size);
  margins_.resize(S);
  argmax_.resize(S);
  scheduled_.reserve(S);
  model_.reserve(T, S, opt_.max_context);
}

std::string Scheduler::check_fits(const SequenceRequest& r) const {
  const int64_t p = static_cast<int64_t>(r.prompt.size());
  if (p + 1 > opt_.max_context) {
    return fmt::format(
        "prompt has {} tokens; the context length is {} (prompt plus at least one "
        "generated token must fit)",
        p, opt_.max_context);
  }
  // note: the last generated token is never fed back, so a sequence caches at
  // most prompt + max_tokens - 1 tokens.
  // note: max_tokens may be as large as INT64_MAX; it is clamped to the room
  // left in the context before the sum, which cannot then overflow.
  const int64_t longest = p + std::min(r.max_tokens, opt_.max_context - p) - 1;
  if (blocks_for(longest) > opt_.num_blocks) {
    return fmt::format("prompt of {} with max_tokens {} needs {} of {}; the cache has only {} {}",
                       count_of(p, "token"), r.max_tokens,
                       count_of(blocks_for(longest), "KV block"),
                       count_of(opt_.block_size, "token"), opt_.num_blocks, kKvCacheTooSmall);
  }
  return {};
}

int64_t Scheduler::add(SequenceRequest r) {
  Seq s;
  s.tokens = r.prompt;
  s.req = std::move(r);
  seqs_.push_back(std::move(s));
  const int64_t h = static_cast<int64_t>(seqs_.size()) - 1;
  waiting_.push_back(h);
  return h;
}

SequenceResult Scheduler::take_result(int64_t handle) {
  Seq& s = seqs_[handle];
  SequenceResult r = std::move(s.result);
  // Drop the request's memory too; only the result was wanted.
  s.req = SequenceRequest{};
  s.tokens = {};
  return r;
}

int32_t Scheduler::position(const Seq& s, int64_t axis, int64_t n) const {
  const int64_t p = static_cast<int64_t>(s.req.prompt.size());
  const auto& m = s.req.mrope_positions;
  if (m.empty()) return static_cast<int32_t>(n);
  if (n < p) return m[axis * p + n];
  // note: transformers continues M-RoPE decode positions at
  // max(all prompt positions) + 1 on all three axes.
  const int32_t base = *std::max_element(m.begin(), m.end()) + 1;
  return static_cast<int32_t>(base + (n - p));
}

void Scheduler::release(Seq& s) {
  for (int32_t b : s.blocks) kv_.release(b);
  s.blocks.clear();
  states_.release(s.state_slot);
  s.state_slot = -1;
  s.computed = 0;
}

void Scheduler::preempt(int64_t handle) {
  release(seqs_[handle]);
  running_.erase(std::find(running_.begin(), running_.end(), handle));
  // Resumed first: it was admitted before everything still waiting.
  waiting_.push_front(handle);
  ++stats_.preemptions;
  hold_admission_ = true;
}

int64_t Scheduler::aligned_end(const Seq& s) const {
  if (align_ <= 1) return 0;
  return static_cast<int64_t>(s.req.prompt.size()) / align_ * align_;
}

int64_t Scheduler::chunk_tokens(const Seq& s, int64_t avail) const {
  const int64_t left = static_cast<int64_t>(s.tokens.size()) - s.computed;
  int64_t n = std::min(left, avail);
  const int64_t end = aligned_end(s);
  if (s.computed >= end) return n;  // the tail and generated tokens: any split
  // note: here s.computed is a multiple of align_ (every earlier chunk ended
  // at one), and at least align_ tokens are left (end <= prompt <= tokens).
  if (opt_.max_batched_tokens < align_) n = std::min(left, std::max(avail, align_));
  const int64_t e = s.computed + n;
  if (e >= end) return n;
  return e / align_ * align_ - s.computed;  // 0: wait for a step with more room
}

bool Scheduler::grow(Seq& s, int64_t tokens) {
  const int64_t need = blocks_for(tokens) - static_cast<int64_t>(s.blocks.size());
  if (need > kv_.free_blocks()) return false;
  for (int64_t i = 0; i < need; ++i) s.blocks.push_back(kv_.allocate());
  return true;
}

// 1. Running sequences, oldest first; preempt the newest when blocks run out.
// Returns the budget left.
int64_t Scheduler::schedule_running(int64_t budget) {
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    const int64_t h = running_[i];
    Seq& s = seqs_[h];
    const int64_t n = finishing(s) ? 0 : chunk_tokens(s, budget);
    if (n == 0) {  // its next aligned chunk does not fit what is left: next step
      ++i;
      continue;
    }
    bool self_preempted = false;
    while (!grow(s, s.computed + n)) {
      if (!queued_.empty()) {  // take the queued results before preempting
        drain_ = true;
        return 0;
      }
      const int64_t victim = running_.back();
      preempt(victim);
      if (victim == h) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;
    scheduled_.emplace_back(h, n);
    budget -= n;
    ++i;
  }
  return budget;
}

// 2. Admit waiting sequences (in order) while there is room.
// note: after a preemption, admission waits for a running sequence to
// finish: re-admitting the preempted one as soon as its first chunk fits
// had it preempted again at the older sequences' next block, over and over
// (a 2,000-token decode beside a 3,000-token prompt on a tight cache
// recomputed 170x the prompt tokens). Only the schedule changes, never a
// result.
void Scheduler::admit_waiting(int64_t budget) {
  if (hold_admission_ && !running_.empty()) return;
  hold_admission_ = false;
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < opt_.max_num_seqs) {
    const int64_t h = waiting_.front();
    Seq& s = seqs_[h];
    const int64_t n = chunk_tokens(s, budget);
    if (n == 0 || !grow(s, n)) break;
    if (spec_.state_floats > 0) {
      s.state_slot = states_.acquire();
      assert(s.state_slot >= 0);  // one slot per possible running sequence
    }
    waiting_.pop_front();
    running_.push_back(h);
    scheduled_.emplace_back(h, n);
    budget -= n;
  }
}

// 3. The step batch of the scheduled chunks, in the scheduler's buffers.
StepBatch Scheduler::build_batch() {
  const int64_t S = static_cast<int64_t>(scheduled_.size());
  int64_t T = 0;
  for (const auto& e : scheduled_) T += e.second;
  int64_t t = 0, num_logits = 0;
  bool any_fed = false;
  for (int64_t i = 0; i < S; ++i) {
    const auto [h, n] = scheduled_[i];
    Seq& s = seqs_[h];
    q_start_[i] = static_cast<int32_t>(t);
    for (int64_t j = 0; j < n; ++j, ++t) {
      const int64_t pos = s.computed + j;
      // A token still queued (pipelined steps) comes from that step's row.
      const bool fed = s.pending > 0 && pos == static_cast<int64_t>(s.tokens.size()) - 1;
      token_ids_[t] = fed ? 0 : s.tokens[pos];
      feed_[t] = fed ? s.pending_row : -1;
      any_fed = any_fed || fed;
      for (int64_t a = 0; a < 3; ++a) positions_[a * T + t] = position(s, a, pos);
      slot_mapping_[t] = static_cast<int64_t>(s.blocks[pos / opt_.block_size]) * opt_.block_size +
                         pos % opt_.block_size;
    }
    seq_len_[i] = static_cast<int32_t>(s.computed + n);
    std::copy(s.blocks.begin(), s.blocks.end(), block_table_.begin() + i * max_blocks_per_seq_);
    state_slot_[i] = s.state_slot;
    const int64_t end = aligned_end(s);
    aligned_tokens_[i] =
        static_cast<int32_t>(s.computed < end ? std::min(s.computed + n, end) - s.computed : 0);
    want_logits_[i] = s.computed + n == static_cast<int64_t>(s.tokens.size());
    num_logits += want_logits_[i];
  }
  q_start_[S] = static_cast<int32_t>(t);

  StepBatch b;
  b.num_seqs = S;
  b.num_tokens = t;
  b.token_ids = token_ids_.data();
  b.positions = positions_.data();
  b.q_start = q_start_.data();
  b.seq_len = seq_len_.data();
  b.block_table = block_table_.data();
  b.max_blocks = max_blocks_per_seq_;
  b.slot_mapping = slot_mapping_.data();
  b.state_slot = state_slot_.data();
  b.want_logits = want_logits_.data();
  b.num_logits = num_logits;
  b.aligned_tokens = align_ > 1 ? aligned_tokens_.data() : nullptr;
  b.feed = any_fed ? feed_.data() : nullptr;
  return b;
}

bool Scheduler::count_tokens() {
  bool any_prefill = false;
  for (const auto& [h, n] : scheduled_) {
    const Seq& s = seqs_[h];
    const bool decode = n == 1 && s.computed >= static_cast<int64_t>(s.req.prompt.size()) &&
                        s.computed >= s.high_water;
    (decode ? stats_.decode_tokens : stats_.prompt_tokens_computed) += n;
    any_prefill = any_prefill || !decode;
  }
  return any_prefill;
}

// Counts the batch's decode and prompt tokens, then runs and times the model
// on it: the greedy tokens and margins land in argmax_ and margins_ (and the
// logits in logits_ when they are computed on the host).
void Scheduler::run_model(const StepBatch& b) {
  const int64_t num_logits = b.num_logits;
  const bool any_prefill = count_tokens();
  const auto t0 = std::chrono::steady_clock::now();
  // note: a model that picks the greedy tokens itself (the GPU) returns the
  // same ids and margins argmax_rows would compute from its logits; the CPU
  // models take the host path, unchanged.
  // note: --logprobs needs the logits themselves, so it takes the host path.
  if (opt_.logprobs > 0 ||
      !model_.forward_greedy(b, kv_, states_, argmax_.data(), margins_.data())) {
    model_.forward(b, kv_, states_, logits_.data());
    if (num_logits > 0) {
      argmax_rows(logits_.data(), num_logits, model_.config().vocab_size, argmax_.data(),
                  margins_.data());
    }
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (any_prefill ? stats_.prefill_seconds : stats_.decode_seconds) += sec;
  ++stats_.steps;
}

void Scheduler::advance(Seq& s, int64_t n) {
  // Tokens at or past the high-water mark are computed for the first time;
  // the others are replayed after a preemption.
  const int64_t p = static_cast<int64_t>(s.req.prompt.size());
  const int64_t first_new = std::max(s.computed, s.high_water);
  const int64_t end = s.computed + n;
  stats_.recomputed_tokens += std::min(first_new, end) - s.computed;
  stats_.prompt_tokens += std::max<int64_t>(0, std::min(end, p) - first_new);
  s.computed += n;
  s.high_water = std::max(s.high_water, s.computed);
}

// 4. Account, append sampled tokens, retire finished sequences.
void Scheduler::account_step(std::vector<int64_t>& finished) {
  const int64_t S = static_cast<int64_t>(scheduled_.size());
  int64_t r = 0;
  for (int64_t i = 0; i < S; ++i) {
    const auto [h, n] = scheduled_[i];
    Seq& s = seqs_[h];
    advance(s, n);
    if (!want_logits_[i]) continue;
    s.tokens.push_back(0);
    take_token(h, static_cast<int64_t>(s.tokens.size()) - 1, argmax_[r], margins_[r], r, finished);
    ++r;
  }
}

bool Scheduler::take_token(int64_t h, int64_t index, int32_t tok, float margin, int64_t logits_row,
                           std::vector<int64_t>& finished) {
  Seq& s = seqs_[h];
  if (std::isnan(margin)) {
    // note: argmax_rows' mark of a NaN or infinite logit. transformers'
    // argmax would pick a NaN's index; no token here would be what the model
    // computes, so the sequence ends with an error instead of a result.
    s.result.error = fmt::format(
        "{} (NaN or infinity) for output token {} at position {}, so its greedy token is not "
        "defined",
        kNonFiniteLogits, s.result.output.size() + 1, index);
    retire(h, finished);
    return true;
  }
  s.result.output.push_back(tok);
  s.result.margins.push_back(margin);
  if (opt_.logprobs > 0) {
    const int64_t vocab = model_.config().vocab_size;
    const size_t at = s.result.top_ids.size();
    s.result.top_ids.resize(at + static_cast<size_t>(opt_.logprobs));
    s.result.top_logprobs.resize(at + static_cast<size_t>(opt_.logprobs));
    top_logprobs(logits_.data() + logits_row * vocab, vocab, opt_.logprobs, &s.result.top_ids[at],
                 &s.result.top_logprobs[at]);
  }
  s.tokens[index] = tok;
  ++stats_.generated_tokens;
  const bool stop =
      std::find(s.req.stop_ids.begin(), s.req.stop_ids.end(), tok) != s.req.stop_ids.end();
  // note: the context counts the tokens up to this one (index + 1): with
  // pipelined steps, tokens may already hold the next step's placeholder.
  const bool length = static_cast<int64_t>(s.result.output.size()) >= s.req.max_tokens ||
                      index + 1 >= opt_.max_context;
  if (!stop && !length) return false;
  s.result.stopped = stop;
  retire(h, finished);
  return true;
}

void Scheduler::retire(int64_t h, std::vector<int64_t>& finished) {
  Seq& s = seqs_[h];
  s.done = true;
  release(s);
  running_.erase(std::find(running_.begin(), running_.end(), h));
  hold_admission_ = false;  // its blocks are free
  finished.push_back(h);
}

bool Scheduler::finishing(const Seq& s) const {
  // note: with a result queued, tokens already holds its placeholder.
  return s.pending > 0 &&
         (static_cast<int64_t>(s.result.output.size()) + s.pending >= s.req.max_tokens ||
          static_cast<int64_t>(s.tokens.size()) >= opt_.max_context);
}

bool Scheduler::submit(const StepBatch& b) {
  const bool was_empty = queued_.empty();
  if (!model_.greedy_submit(b, kv_, states_)) return false;
  const auto now = std::chrono::steady_clock::now();
  if (was_empty) mark_ = now;
  Queued q;
  q.prefill = count_tokens();
  int32_t r = 0;
  for (size_t i = 0; i < scheduled_.size(); ++i) {
    const auto [h, n] = scheduled_[i];
    Seq& s = seqs_[h];
    advance(s, n);  // now: the next step is built on it
    int64_t index = -1;
    if (want_logits_[i]) {
      s.tokens.push_back(0);  // placeholder until collect()
      index = static_cast<int64_t>(s.tokens.size()) - 1;
      ++s.pending;
      s.pending_row = r++;
    }
    q.entries.emplace_back(h, n, index);
  }
  queued_.push_back(std::move(q));
  ++stats_.steps;
  return true;
}

void Scheduler::collect(std::vector<int64_t>& finished) {
  Queued q = std::move(queued_.front());
  queued_.pop_front();
  model_.greedy_collect(argmax_.data(), margins_.data());
  const auto now = std::chrono::steady_clock::now();
  (q.prefill ? stats_.prefill_seconds : stats_.decode_seconds) +=
      std::chrono::duration<double>(now - mark_).count();
  mark_ = now;
  int64_t r = 0;
  for (const auto& [h, n, index] : q.entries) {
    if (index < 0) continue;
    Seq& s = seqs_[h];
    const int64_t row = r++;
    --s.pending;
    // A row computed for a sequence that stopped on the token before it.
    if (s.done) continue;
    take_token(h, index, argmax_[row], margins_[row], row, finished);
  }
}

void Scheduler::step(std::vector<int64_t>& finished) {
  scheduled_.clear();
  const int64_t left = schedule_running(opt_.max_batched_tokens);
  if (drain_) {  // a preemption is due: first every queued result
    drain_ = false;
    scheduled_.clear();
    while (!queued_.empty()) collect(finished);
    return;
  }
  admit_waiting(left);
  if (scheduled_.empty()) {
    if (!queued_.empty()) {  // what is left waits on the queued results
      collect(finished);
      return;
    }
    // Cannot happen when every request passed check_fits: a lone sequence
    // always fits. Guard against an infinite loop anyway.
    fail("scheduler: no sequence could be scheduled ({} waiting, {} free KV blocks)",
         waiting_.size(), kv_.free_blocks());
  }

  const StepBatch b = build_batch();
  if (pipeline_) {
    if (submit(b)) {
      if (queued_.size() == 2) collect(finished);
      return;
    }
    pipeline_ = false;  // the model has no pipelined path
  }
  run_model(b);
  account_step(finished);
}

}  // namespace qtk
