#include "runtime/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace qtk {

void top_logprobs(const float* logits, int64_t vocab, int k, int32_t* ids, float* logprobs) {
  const float max = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - max));
  const float log_sum = static_cast<float>(std::log(sum));
  // note: a partial sort of the ids by (logit descending, id ascending).
  thread_local std::vector<int32_t> order;
  order.resize(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t n = std::min<int64_t>(k, vocab);
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int64_t j = 0; j < n; ++j) {
    ids[j] = order[static_cast<size_t>(j)];
    logprobs[j] = (logits[ids[j]] - max) - log_sum;
  }
}

}  // namespace qtk
