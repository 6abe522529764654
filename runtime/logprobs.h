// Top-K log-probabilities of one row of logits (generate --logprobs K).
#pragma once

#include <cstdint>

namespace qtk {

// Writes the k most likely tokens of `logits[vocab]` (larger logit first,
// ties to the lower id, the greedy rule) into ids[k] and their
// log-probabilities log_softmax(logits)[id] into logprobs[k].
//
// note: computed from the same float32 logits as the greedy choice, with
// one fixed summation order (ids 0..vocab-1, accumulated in float64, the
// result rounded to float32), so the values are bit-identical whenever the
// logits are, however the run was batched, chunked or threaded.
void top_logprobs(const float* logits, int64_t vocab, int k, int32_t* ids, float* logprobs);

}  // namespace qtk
