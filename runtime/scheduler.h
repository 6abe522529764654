// Continuous batching over a paged KV cache: the scheduler owns the
// sequences, their block tables and state slots, and builds one StepBatch per
// step (prefill chunks and decode tokens mixed). It does not know any layer.
//
// note: results never depend on the schedule. Every kernel computes each
// output element with a reduction order fixed by the element alone (not by
// the batch, the chunking, the block size or the thread count), so a
// sequence gives the same bits alone, in any batch, chunked any way, and
// after preemption (which frees its blocks and later recomputes its prompt
// plus the tokens it had generated, exactly replaying the arithmetic).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/kv_cache.h"
#include "runtime/model.h"

namespace qtk {

struct SequenceRequest {
  std::vector<int32_t> prompt;
  // [3][prompt.size()] M-RoPE positions (temporal, height, width); empty for
  // text, where every axis uses the token index.
  std::vector<int32_t> mrope_positions;
  int64_t max_tokens = 0;         // >= 1
  std::vector<int32_t> stop_ids;  // generation stops after emitting one of these
};

struct SequenceResult {
  std::vector<int32_t> output;
  std::vector<float> margins;  // logit(top1) - logit(top2) per step
  // With SchedulerOptions::logprobs = K: K (id, log-probability) pairs per
  // step, most likely first (runtime/logprobs.h).
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  bool stopped = false;  // ended on a stop id (else: length)
  // Non-empty when the sequence ended without a result: the model computed a
  // non-finite logit (kNonFiniteLogits) for its next token, so no greedy
  // token is defined. output holds the tokens before it; an error line is
  // written instead of them.
  std::string error;
};

// The start of SequenceResult::error for a row of logits holding a NaN or an
// infinity (argmax_rows' NaN margin); --resume keeps such error lines.
inline constexpr const char* kNonFiniteLogits = "the model computed a non-finite logit";
// The end of the error of a request that alone needs more KV blocks than the
// cache has (Scheduler::check_fits); --resume recognises such lines by it.
inline constexpr const char* kKvCacheTooSmall = "(raise --kv-cache-blocks)";

struct SchedulerOptions {
  int64_t max_num_seqs = 64;
  // note: with a model whose prefill alignment A > 1 (Model::prefill_alignment),
  // a prefill chunk inside the prompt's first A*floor(L/A) tokens ends only
  // at a multiple of A; when this budget is below A, a sequence there gets A
  // tokens anyway, so one step holds up to max_batched_tokens + A - 1 tokens.
  int64_t max_batched_tokens = 512;
  int64_t block_size = 16;
  int64_t num_blocks = 0;   // K/V blocks in the cache
  int64_t max_context = 0;  // longest sequence (prompt + generated) allowed
  int logprobs = 0;         // top-K log-probabilities per step (0: none; needs host logits)
};

struct SchedulerStats {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;  // prompt tokens computed the first time
  int64_t generated_tokens = 0;
  int64_t recomputed_tokens = 0;       // tokens computed again after a preemption
  int64_t prompt_tokens_computed = 0;  // tokens computed in prefill chunks (incl. replays)
  int64_t decode_tokens = 0;           // tokens computed as one new token of a sequence
  double prefill_seconds = 0;          // wall time of steps with any prefill token
  double decode_seconds = 0;           // wall time of steps with decode tokens only
};

class Scheduler {
 public:
  Scheduler(Model& model, const SchedulerOptions& options);

  // Empty when `r` can run to completion on this cache alone; otherwise the
  // reason (for the error line of that prompt).
  std::string check_fits(const SequenceRequest& r) const;
  // Queues a request (which must pass check_fits); returns its handle.
  int64_t add(SequenceRequest r);
  bool has_work() const { return !running_.empty() || !waiting_.empty() || !queued_.empty(); }
  // Runs one step; appends the handles of sequences that finished in it.
  // note: pipelined steps. With a model that queues greedy steps
  // (Model::greedy_submit: the GPU), a call queues the next step before it
  // takes the results of the step queued by the call before, so the device
  // never waits for the host between steps. The next step is built before
  // those results are known: each sequence that awaits a token from the
  // queued step computes it there too (StepBatch::feed), as if it did not
  // stop; one that does stop on that token gets that extra row's result
  // dropped. Results do not depend on the batch (header note), so that row
  // changes no other sequence's bits. A step that would have to preempt
  // first takes every queued result, then schedules again.
  // QTK_PIPELINE=0 (core/tuning.h) runs every step synchronously.
  void step(std::vector<int64_t>& finished);
  // Moves a finished sequence's result out.
  SequenceResult take_result(int64_t handle);

  const SchedulerStats& stats() const { return stats_; }
  const SchedulerOptions& options() const { return opt_; }

 private:
  struct Seq {
    SequenceRequest req;
    std::vector<int32_t> tokens;  // prompt then generated tokens
    SequenceResult result;
    int64_t computed = 0;    // tokens whose K/V and state are cached
    int64_t high_water = 0;  // most tokens ever computed (recompute accounting)
    std::vector<int32_t> blocks;
    int32_t state_slot = -1;
    bool done = false;
    // Pipelined steps: results still queued for this sequence (0-2), and the
    // newest one's logit row in the step queued last. note: when the next
    // step is built at most one is queued, and its placeholder is
    // tokens.back().
    int pending = 0;
    int32_t pending_row = -1;
  };
  // A queued pipelined step: its (handle, tokens, index of tokens its result
  // fills or -1) entries, and whether it held prompt tokens.
  struct Queued {
    std::vector<std::tuple<int64_t, int64_t, int64_t>> entries;
    bool prefill = false;
  };
  int64_t blocks_for(int64_t tokens) const {
    return (tokens + opt_.block_size - 1) / opt_.block_size;
  }
  // End of the prompt's full aligned chunks: align_ * floor(prompt / align_)
  // (0 when align_ is 1: no alignment).
  int64_t aligned_end(const Seq& s) const;
  // Tokens of `s` to compute this step with `avail` of the budget left
  // (0: the sequence waits for a step with more room), by the alignment rule.
  int64_t chunk_tokens(const Seq& s, int64_t avail) const;
  int32_t position(const Seq& s, int64_t axis, int64_t n) const;
  void preempt(int64_t handle);
  void release(Seq& s);
  bool grow(Seq& s, int64_t tokens);
  // The parts of step(), in order.
  int64_t schedule_running(int64_t budget);
  void admit_waiting(int64_t budget);
  StepBatch build_batch();
  // Counts the step's decode and prompt tokens; true when it held a prompt
  // token (a prefill step).
  bool count_tokens();
  void run_model(const StepBatch& b);
  // s computed n more tokens (the stats of prompt and recomputed tokens).
  void advance(Seq& s, int64_t n);
  void account_step(std::vector<int64_t>& finished);
  // Pipelined steps: queue b (false: the model has no such path, nothing
  // done), and take the oldest queued step's results.
  bool submit(const StepBatch& b);
  void collect(std::vector<int64_t>& finished);
  // The sampled token tok (margin) of s: appended to its result; true when
  // it ends the sequence (a stop id, the length, or a NaN margin: a row of
  // non-finite logits, which ends it with an error), which is then retired.
  bool take_token(int64_t h, int64_t index, int32_t tok, float margin, int64_t logits_row,
                  std::vector<int64_t>& finished);
  // s (handle h) is done: its blocks and slot freed, listed in finished.
  void retire(int64_t h, std::vector<int64_t>& finished);
  // A running sequence whose queued token is its last (length): not scheduled.
  bool finishing(const Seq& s) const;

  Model& model_;
  SchedulerOptions opt_;
  CacheSpec spec_;
  KvCache kv_;
  StatePool states_;
  std::vector<Seq> seqs_;
  std::deque<int64_t> waiting_;
  std::vector<int64_t> running_;  // in admission order
  SchedulerStats stats_;
  int64_t max_blocks_per_seq_ = 0;
  int64_t align_ = 1;          // model_.prefill_alignment()
  int64_t step_capacity_ = 0;  // most tokens in one step (see the constructor)

  // Step buffers, sized once.
  std::vector<int32_t> token_ids_, positions_, q_start_, seq_len_, block_table_, state_slot_,
      aligned_tokens_, feed_;
  std::vector<int64_t> slot_mapping_;
  std::vector<uint8_t> want_logits_;
  std::vector<float> logits_, margins_;
  std::vector<int32_t> argmax_;
  std::vector<std::pair<int64_t, int64_t>> scheduled_;  // (handle, tokens this step)
  // Pipelined steps (queued, oldest first); pipeline_: still to be tried or
  // in use (false once the model declined, or under QTK_PIPELINE=0).
  std::deque<Queued> queued_;
  bool pipeline_ = true;
  bool drain_ = false;  // schedule_running met a preemption with steps queued
  // A sequence was preempted: nothing is admitted until a running sequence
  // finishes (or none runs), so the preempted one is not re-admitted at once
  // only to be preempted again while the older ones still grow.
  bool hold_admission_ = false;
  std::chrono::steady_clock::time_point mark_;  // end of the last collect (or first submit)
};

}  // namespace qtk
