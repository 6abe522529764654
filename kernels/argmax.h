// Greedy sampling: argmax per row with ties to the lowest id, plus the margin.
#pragma once

#include <cstdint>

namespace qtk {

// logits: f32 [rows, vocab] contiguous. ids[r] = the lowest index of the
// maximum; margin[r] (optional, may be null) = logit(top1) - logit(top2),
// where top2 is the largest logit at any other index (0 on a tie).
// A row holding a non-finite logit (NaN, +inf or -inf) has no greedy token
// the model defines: its margin is NaN (whatever the vocabulary size), and
// ids[r] is the argmax of its finite logits, or 0 when none is finite.
// note: comparisons only, no arithmetic, so the result is exact.
void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, float* margin);

}  // namespace qtk
