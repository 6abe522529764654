// The interface every backend's model implements (runtime/backend/cpu,
// runtime/backend/cuda; architectures are runtime/models/*) and the one step
// description the scheduler hands it. The scheduler knows
// nothing about layers: it owns sequences, block tables and state slots, and
// asks the model only how big a sequence's cache entries are.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "loaders/model_config.h"

namespace qtk {

class Pack;
class ThreadPool;
class KvCache;
class StatePool;

// What one scheduler step computes: for each scheduled sequence a run of
// consecutive tokens (a prefill chunk or one decode token), all packed into
// one flat token dimension of length num_tokens.
struct StepBatch {
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  const int32_t* token_ids = nullptr;  // [num_tokens]
  // note: three rows (temporal, height, width) for M-RoPE; plain-RoPE models
  // read row 0 only. Text tokens carry the same value in all three rows.
  const int32_t* positions = nullptr;    // [3][num_tokens], row stride num_tokens
  const int32_t* q_start = nullptr;      // [num_seqs + 1] token offsets of each sequence
  const int32_t* seq_len = nullptr;      // [num_seqs] tokens in cache after this step
  const int32_t* block_table = nullptr;  // [num_seqs][max_blocks] physical block ids
  int64_t max_blocks = 0;
  const int64_t* slot_mapping = nullptr;  // [num_tokens] block * block_size + offset
  const int32_t* state_slot = nullptr;    // [num_seqs] recurrent-state slot (StatePool)
  // Sequences whose last token in this step needs logits (the chunk reaches
  // the end of what is known about the sequence). Logits rows are written in
  // the order of these sequences.
  const uint8_t* want_logits = nullptr;  // [num_seqs] 0/1
  int64_t num_logits = 0;                // count of want_logits[s] == 1
  // Leading tokens of each sequence's run that are prompt tokens in full
  // chunks aligned to Model::prefill_alignment() (a multiple of it, the run
  // starting at a multiple of it; 0 for every other run). nullptr: none. A
  // model with an alignment > 1 may compute these tokens in its chunked form;
  // every other token goes the token-by-token way.
  const int32_t* aligned_tokens = nullptr;  // [num_seqs]
  // Pipelined greedy steps only (Model::greedy_submit): feed[t] = r >= 0
  // makes token t's id the greedy id of logit row r of the step queued just
  // before this one (token_ids[t] is then ignored); -1: token_ids[t].
  // nullptr: none.
  const int32_t* feed = nullptr;  // [num_tokens]
};

// Whether sequence s of the step starts at position 0 (a new sequence, or
// one recomputed from its start after preemption): its recurrent state then
// starts empty. Every backend clears the state by this one rule.
inline bool starts_sequence(const StepBatch& b, int64_t s) {
  return b.seq_len[s] == b.q_start[s + 1] - b.q_start[s];
}

// Sizes of the per-sequence caches a model needs (what the scheduler
// allocates before the first step).
struct CacheSpec {
  int64_t attention_layers = 0;  // layers with a paged K/V cache
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t state_floats = 0;  // recurrent state per sequence slot (0: none)
};

// Debug hook: called after decoder layer `layer` (0-based) with its output
// hidden states [num_tokens, hidden] (row stride `ld`), and once more with
// layer == num_layers for the final norm's output. Used by the per-layer
// activation tests; nullptr on the normal path.
using LayerHook = std::function<void(int64_t layer, const float* hidden, int64_t num_tokens,
                                     int64_t hidden_size, int64_t ld)>;

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual CacheSpec cache_spec() const = 0;
  // The batch sizes the scratch buffers must hold; called once before the
  // first forward (no allocation happens on the hot path afterwards).
  virtual void reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) = 0;
  // Runs one step. K/V of every token are written to `kv`, recurrent state
  // is read and updated in `states`. logits: [batch.num_logits, vocab].
  virtual void forward(const StepBatch& batch, KvCache& kv, StatePool& states, float* logits) = 0;
  // Runs one step and picks the greedy tokens where the logits live (the
  // GPU), without copying [num_logits, vocab] floats to the host: ids[r] is
  // the argmax of logits row r (ties to the lowest id) and margins[r] its
  // top1 - top2 logit, the values kernels/argmax.h computes from forward's
  // logits. Returns false, having done nothing, when the model has no such
  // path; the scheduler then calls forward and picks on the host.
  virtual bool forward_greedy(const StepBatch& /*batch*/, KvCache& /*kv*/, StatePool& /*states*/,
                              int32_t* /*ids*/, float* /*margins*/) {
    return false;
  }
  // Pipelined greedy steps (the GPU): greedy_submit queues a step and
  // returns at once; greedy_collect waits for the oldest queued step and
  // gives its ids and margins (as forward_greedy would). So the host builds
  // the next step, whose fed tokens (StepBatch::feed) come from the queued
  // step's results on the device, while the device still runs that one:
  // the device does not wait for the host between steps. At most two steps
  // are queued at once (submit, submit, collect, submit, collect, ...).
  // greedy_submit returns false, having done nothing, when the model has
  // no such path (then the scheduler runs forward_greedy or forward).
  virtual bool greedy_submit(const StepBatch& /*batch*/, KvCache& /*kv*/, StatePool& /*states*/) {
    return false;
  }
  virtual void greedy_collect(int32_t* /*ids*/, float* /*margins*/) {}
  // note: prefill alignment A. A prompt's first A*floor(L/A) tokens may be
  // computed in A-token chunks anchored at positions 0, A, 2A, ... (the
  // chunked GDN form on the GPU, bf16), so the scheduler never ends a prefill
  // chunk inside one of them: a prompt's result then never depends on how it
  // was split. 1 (any split) for every model whose arithmetic is the same
  // token by token.
  virtual int64_t prefill_alignment() const { return 1; }
  // Whether forward reads and writes the host KvCache / StatePool storage.
  // A device model keeps its own copies and uses only their bookkeeping
  // (block and slot ids), so the scheduler then allocates no host floats.
  virtual bool uses_host_cache() const { return true; }
  void set_layer_hook(LayerHook hook) { hook_ = std::move(hook); }

 protected:
  LayerHook hook_;
};

// Builds the model the pack's config names. Throws qtk::Error for an
// architecture this build cannot run or a pack missing a tensor.
std::unique_ptr<Model> load_model(const Pack& pack, ThreadPool* pool);

}  // namespace qtk
