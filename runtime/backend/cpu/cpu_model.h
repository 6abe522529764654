// The CPU backend: a Model (runtime/model.h) that runs an architecture's
// blocks (runtime/backend/blocks.h) with the CPU kernels. Weights stay views
// into the mapped pack, with tile-order copies of the matrices on the avx512
// path (tiled_weights.h); the K/V cache and the recurrent state are the
// scheduler's host KvCache and StatePool.
#pragma once

#include <memory>

#include "runtime/model.h"
#include "runtime/parallel/tensor_parallel.h"

namespace qtk {

class Pack;
class ThreadPool;
class RankGroup;

// tp, group: rank tp.rank of a tensor-parallel model (runtime/parallel),
// whose ranks add their partial sums through `group`; the default is the
// whole model.
std::unique_ptr<Model> make_cpu_model(const Pack& pack, ThreadPool* pool, TpRank tp = {},
                                      RankGroup* group = nullptr);

}  // namespace qtk
