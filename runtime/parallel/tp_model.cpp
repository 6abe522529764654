#include "runtime/parallel/tp_model.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/parallel/rank_group.h"

namespace qtk {

TensorParallelModel::TensorParallelModel(RankGroup& group, const ModelConfig& full,
                                         const RankFactory& factory)
    : group_(group), full_(full), ranks_(group.size()) {
  for (int r = 0; r < group.size(); ++r) threads_.emplace_back([this, r] { worker(r); });
  try {
    run_on_ranks([&](int r) { ranks_[r] = factory(r); });
  } catch (...) {
    // Stop the threads before the members they use go away.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    task_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    throw;
  }
}

TensorParallelModel::~TensorParallelModel() {
  // Rank models are destroyed in their own threads (a CUDA rank frees its
  // device memory with its device current).
  if (!threads_.empty()) {
    try {
      run_on_ranks([&](int r) { ranks_[r].reset(); });
    } catch (...) {  // nothing more can be done about a failing destructor
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    task_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
}

void TensorParallelModel::worker(int rank) {
  int64_t seen = 0;
  for (;;) {
    std::function<void(int)> fn;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      task_cv_.wait(lock, [&] { return stop_ || task_generation_ != seen; });
      if (stop_) return;
      seen = task_generation_;
      fn = task_;
    }
    try {
      fn(rank);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      group_.abort();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

void TensorParallelModel::run_on_ranks(const std::function<void(int)>& fn) {
  std::unique_lock<std::mutex> lock(mutex_);
  task_ = fn;
  error_ = nullptr;
  pending_ = static_cast<int>(threads_.size());
  ++task_generation_;
  task_cv_.notify_all();
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void TensorParallelModel::reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) {
  max_seqs_ = std::max(max_seqs_, max_seqs);
  run_on_ranks([&](int r) { ranks_[r]->reserve(max_tokens, max_seqs, max_context); });
}

void TensorParallelModel::prepare_caches(const KvCache& kv) {
  if (!ranks_[0]->uses_host_cache()) return;
  if (!rank_kv_.empty() && rank_kv_[0]->num_blocks() == kv.num_blocks() &&
      rank_kv_[0]->block_size() == kv.block_size())
    return;
  rank_kv_.clear();
  rank_states_.clear();
  for (const auto& m : ranks_) {
    const CacheSpec spec = m->cache_spec();
    rank_kv_.push_back(std::make_unique<KvCache>(spec, kv.num_blocks(), kv.block_size()));
    rank_states_.push_back(std::make_unique<StatePool>(spec.state_floats, max_seqs_));
  }
}

void TensorParallelModel::forward(const StepBatch& b, KvCache& kv, StatePool& states,
                                  float* logits) {
  prepare_caches(kv);
  ranks_[0]->set_layer_hook(hook_);
  scratch_.resize(ranks_.size());
  for (size_t r = 1; r < ranks_.size(); ++r)
    scratch_[r].resize(static_cast<size_t>(b.num_logits * full_.vocab_size));
  run_on_ranks([&](int r) {
    ranks_[r]->forward(b, rank_kv(r, kv), rank_states(r, states),
                       r == 0 ? logits : scratch_[r].data());
  });
}

bool TensorParallelModel::forward_greedy(const StepBatch& b, KvCache& kv, StatePool& states,
                                         int32_t* ids, float* margins) {
  prepare_caches(kv);
  ranks_[0]->set_layer_hook(hook_);
  scratch_.resize(ranks_.size());
  scratch_ids_.resize(ranks_.size());
  for (size_t r = 1; r < ranks_.size(); ++r) {
    scratch_[r].resize(static_cast<size_t>(b.num_logits));
    scratch_ids_[r].resize(static_cast<size_t>(b.num_logits));
  }
  // note: every rank is the same backend, so all of them have the greedy
  // path or none; a rank without it did nothing.
  std::vector<char> done(ranks_.size(), 0);
  run_on_ranks([&](int r) {
    done[r] = ranks_[r]->forward_greedy(b, rank_kv(r, kv), rank_states(r, states),
                                        r == 0 ? ids : scratch_ids_[r].data(),
                                        r == 0 ? margins : scratch_[r].data());
  });
  return done[0] != 0;
}

}  // namespace qtk
