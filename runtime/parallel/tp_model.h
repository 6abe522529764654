// A tensor-parallel model (runtime/parallel/tensor_parallel.h): one Model
// over N rank models, each built and run in a thread of its own (the CUDA
// backend's ranks select their GPU in it; the CPU backend's emulated ranks
// each have a thread pool of their own). Every step runs on all ranks at
// once; the ranks meet in their all-reduces, and rank 0's logits (or greedy
// tokens) are the step's result: after the last all-reduce every rank holds
// the same residual stream, so every rank computes the same logits.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/kv_cache.h"
#include "runtime/model.h"

namespace qtk {

class RankGroup;

class TensorParallelModel final : public Model {
 public:
  using RankFactory = std::function<std::unique_ptr<Model>(int rank)>;
  // Starts group.size() rank threads and builds rank r's model in thread r
  // with factory(r). A rank that fails aborts `group`, so that no other rank
  // waits for it; the first failure is rethrown here.
  TensorParallelModel(RankGroup& group, const ModelConfig& full, const RankFactory& factory);
  ~TensorParallelModel() override;
  TensorParallelModel(const TensorParallelModel&) = delete;
  TensorParallelModel& operator=(const TensorParallelModel&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  Model& rank(int r) { return *ranks_[r]; }

  // The unsplit model's config; the cache spec is one rank's (the K/V heads
  // and state it holds).
  const ModelConfig& config() const override { return full_; }
  CacheSpec cache_spec() const override { return ranks_[0]->cache_spec(); }
  void reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) override;
  void forward(const StepBatch& batch, KvCache& kv, StatePool& states, float* logits) override;
  bool forward_greedy(const StepBatch& batch, KvCache& kv, StatePool& states, int32_t* ids,
                      float* margins) override;
  int64_t prefill_alignment() const override { return ranks_[0]->prefill_alignment(); }
  // note: the scheduler's caches are bookkeeping only; each rank's K/V heads
  // and state live with the rank (host ones made here for host-cache ranks).
  bool uses_host_cache() const override { return false; }

  // Runs fn(rank) on every rank's thread at once and waits for all of them.
  void run_on_ranks(const std::function<void(int)>& fn);

 private:
  void worker(int rank);
  // The K/V cache and state a rank reads: its own host copies when the rank
  // model uses host caches (made for the scheduler's geometry), else the
  // scheduler's (device ranks use only their bookkeeping).
  void prepare_caches(const KvCache& kv);
  KvCache& rank_kv(int r, KvCache& kv) { return rank_kv_.empty() ? kv : *rank_kv_[r]; }
  StatePool& rank_states(int r, StatePool& s) {
    return rank_states_.empty() ? s : *rank_states_[r];
  }

  RankGroup& group_;
  ModelConfig full_;
  std::vector<std::unique_ptr<Model>> ranks_;
  std::vector<std::unique_ptr<KvCache>> rank_kv_;
  std::vector<std::unique_ptr<StatePool>> rank_states_;
  std::vector<std::vector<float>> scratch_;  // ranks > 0: logits or margins nobody reads
  std::vector<std::vector<int32_t>> scratch_ids_;
  int64_t max_seqs_ = 0;

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable task_cv_, done_cv_;
  std::function<void(int)> task_;
  int64_t task_generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;  // the first rank failure of the current task
};

}  // namespace qtk
