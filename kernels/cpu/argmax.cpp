#include "kernels/argmax.h"

#include <cmath>
#include <limits>

namespace qtk {

void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, float* margin) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr float kMax = std::numeric_limits<float>::max();
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    float best = kNegInf, second = kNegInf;
    int64_t best_id = 0;
    bool finite = true;
    for (int64_t i = 0; i < vocab; ++i) {
      float v = row[i];
      if (!(std::fabs(v) <= kMax)) {  // NaN or +-inf: marks the row, never wins
        finite = false;
      } else if (v > best) {  // strict: ties keep the lowest id
        second = best;
        best = v;
        best_id = i;
      } else if (v > second) {
        second = v;
      }
    }
    ids[r] = static_cast<int32_t>(best_id);
    if (margin != nullptr) margin[r] = !finite ? kNaN : vocab > 1 ? best - second : 0.0f;
  }
}

}  // namespace qtk
