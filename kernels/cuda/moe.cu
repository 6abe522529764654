#include "kernels/cuda/moe.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/warp_matmul.cuh"

namespace qtk::cuda {

namespace {

using namespace dev;
using bf16 = __nv_bfloat16;

constexpr int kMaxExperts = 4096;
constexpr int kMaxTopK = 32;
constexpr int kWarpRouteExperts = 1024;    // one warp routes a token up to this many experts
constexpr int kCombineThreads = 256;       // moe_combine's columns per block
constexpr int kFrontMaxTokens = 16;        // moe_router_front in one launch up to this many tokens
constexpr int kFrontExperts = 8;           // experts per block of the one-launch front
constexpr int kLogitsWarps = 4;            // warps per block of moe_router_logits_kernel
constexpr int kItemTokens = 4;             // tokens of a warp's item (1 expert x 4 tokens)
constexpr int kTileExperts = 4;            // a warp tile past 64 tokens: 4 experts
constexpr int kTileTokens = 8;             //   x 8 tokens
constexpr int kTiledLogitsMinTokens = 65;  // from here the logits take 4 x 8 warp tiles
// note: the router's shapes. One launch up to 16 tokens: its last block
// routes them with its 8 warps (2 tokens each at most), and a decode step
// of up to 16 sequences pays one launch instead of three. 8 experts per
// block of 8 warps: at batch 1 each warp takes one expert's row, and
// E / 8 blocks (16 for 128 experts) read the router together. A lone token
// keeps 8 of its lane's pieces in flight (a 2048-wide bf16 row in one
// round trip); 4 tokens keep 2 (the registers of 4 rows). Past 64 tokens
// 4 x 8 tiles read each router row once per 8 tokens instead of per 4.

// (p, e) is ahead of (bp, be) in the top-k order: larger probability, ties
// to the lower expert index. A total order, so any reduction tree picks the
// same winner.
__device__ __forceinline__ bool ahead(float p, int e, float bp, int be) {
  return p > bp || (p == bp && e < be);
}

// The warp's first (p, e) in the top-k order (ahead): every lane ends with
// it (a total order, so the butterfly's pairings cannot change the winner).
__device__ __forceinline__ void warp_ahead_max(float& bp, int& be) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float op = __shfl_xor_sync(0xffffffffu, bp, o);
    const int oe = __shfl_xor_sync(0xffffffffu, be, o);
    if (ahead(op, oe, bp, be)) {
      bp = op;
      be = oe;
    }
  }
}

// A probability as the top k ranks it: a NaN (from NaN hidden states only)
// ranks as -1, below every probability, so that every slot still gets a
// valid expert.
__device__ __forceinline__ float rank_key(float p) { return isnan(p) ? -1.0f : p; }

// Router logits of a warp tile: out[i][j] = the logit of router row i (i <
// ne, rows w + i*H) for token j (j < nt, rows x + j*ldx), every lane.
// note: one fixed order, whatever tile, kernel or batch computes a logit:
// lane l takes the 16-byte pieces at l*V, l*V + 32V, ... (V elements of T)
// in increasing order, each piece's elements in increasing order, into one
// f32 fma chain per output, and the warp's xor butterfly adds the 32 lane
// sums. U pieces are loaded before their fmas (the loads of a batch are in
// flight together). Slots past ne / nt recompute row / token 0 and are
// discarded. H % V == 0, rows 16-byte aligned.
template <class T, int NE, int NT, int U>
__device__ __forceinline__ void router_tile(const T* __restrict__ x, int64_t ldx, int nt,
                                            const T* __restrict__ w, int ne, int H,
                                            float (&out)[NE][NT]) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  const int lane = threadIdx.x & 31;
  float acc[NE][NT];
#pragma unroll
  for (int i = 0; i < NE; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[i][j] = 0.0f;
  for (int base = lane * V; base < H; base += 32 * V * U) {
    uint4 wv[U][NE], xv[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = base + 32 * V * u;
      if (c < H) {
#pragma unroll
        for (int i = 0; i < NE; ++i)
          wv[u][i] = __ldg(
              reinterpret_cast<const uint4*>(w + static_cast<int64_t>(i < ne ? i : 0) * H + c));
#pragma unroll
        for (int j = 0; j < NT; ++j)
          xv[u][j] =
              *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(j < nt ? j : 0) * ldx + c);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + 32 * V * u >= H) break;
#pragma unroll
      for (int i = 0; i < NE; ++i) {
        const T* wp = reinterpret_cast<const T*>(&wv[u][i]);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const T* xp = reinterpret_cast<const T*>(&xv[u][j]);
#pragma unroll
          for (int v = 0; v < V; ++v) acc[i][j] = fmaf(to_f(xp[v]), to_f(wp[v]), acc[i][j]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < NE; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) out[i][j] = warp_sum(acc[i][j]);
}

// Stores a warp tile's logits (lane 0): logits [*, E] from token t, expert e.
template <int NE, int NT>
__device__ __forceinline__ void store_logits(const float (&out)[NE][NT], float* logits, int E,
                                             int t, int nt, int e, int ne) {
  if ((threadIdx.x & 31) != 0) return;
#pragma unroll
  for (int i = 0; i < NE; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
      if (i < ne && j < nt) logits[static_cast<int64_t>(t + j) * E + e + i] = out[i][j];
}

// The logits of tokens t0 .. t0+ntok-1 by one warp per (expert, NT tokens)
// item, items warp, warp + nw, ... of the experts e0 .. e0+ne-1; NT = 1
// for a single token (the batch-1 decode step: more pieces in flight).
template <class T>
__device__ __forceinline__ void router_items(const T* h, int64_t ldh, const T* router, int ntok,
                                             int e0, int ne, int E, int H, float* logits, int warp,
                                             int nw) {
  if (ntok == 1) {
    for (int e = e0 + warp; e < e0 + ne; e += nw) {
      float out[1][1];
      router_tile<T, 1, 1, 8>(h, ldh, 1, router + static_cast<int64_t>(e) * H, 1, H, out);
      store_logits(out, logits, E, 0, 1, e, 1);
    }
    return;
  }
  constexpr int NT = kItemTokens;
  const int groups = (ntok + NT - 1) / NT;
  for (int item = warp; item < ne * groups; item += nw) {
    const int e = e0 + item % ne, t = (item / ne) * NT, nt = min(NT, ntok - t);
    float out[1][NT];
    router_tile<T, 1, NT, 2>(h + static_cast<int64_t>(t) * ldh, ldh, nt,
                             router + static_cast<int64_t>(e) * H, 1, H, out);
    store_logits(out, logits, E, t, nt, e, 1);
  }
}

// One token's routing by one warp (E <= kWarpRouteExperts): the softmax of
// its E logits, then its top k in k rounds of a warp arg-max (ties to the
// lower expert), weights renormalised by their sum in choice order.
// note: the order is fixed by E alone: lane l holds experts l, l + 32, ...;
// the max and the sum of exponentials are each lane's in expert order, then
// the xor butterfly (rank_key for NaN probabilities).
template <int kPer>
__device__ __forceinline__ void route_token_warp(const float* logits, int E, int k,
                                                 bool renormalize, int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  float p[kPer];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? __ldcg(logits + e) : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  mx = warp_max(mx);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + 32 * i < E) {
      p[i] = expf(p[i] - mx);
      s += p[i];
    }
  s = warp_sum(s);
#pragma unroll
  for (int i = 0; i < kPer; ++i) p[i] = p[i] / s;
  uint32_t taken = 0;
  float sum = 0.0f, my_p = 0.0f;
  int my_e = 0;
  for (int j = 0; j < k; ++j) {
    float bp = -2.0f;
    int be = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      const float pe = rank_key(p[i]);
      if (e < E && !((taken >> i) & 1u) && ahead(pe, e, bp, be)) {
        bp = pe;
        be = e;
      }
    }
    warp_ahead_max(bp, be);
    if ((be & 31) == lane) taken |= 1u << (be >> 5);
    sum += bp;
    if (lane == j) {
      my_p = bp;
      my_e = be;
    }
  }
  if (lane < k) {
    ids[lane] = my_e;
    weights[lane] = renormalize ? my_p / sum : my_p;
  }
}

// route_token_warp with as few experts per lane as E needs (the same bits:
// slots past E take no part).
__device__ __forceinline__ void route_token(const float* logits, int E, int k, bool renormalize,
                                            int32_t* ids, float* weights) {
  if (E <= 128)
    route_token_warp<4>(logits, E, k, renormalize, ids, weights);
  else if (E <= 256)
    route_token_warp<8>(logits, E, k, renormalize, ids, weights);
  else if (E <= 512)
    route_token_warp<16>(logits, E, k, renormalize, ids, weights);
  else
    route_token_warp<kWarpRouteExperts / 32>(logits, E, k, renormalize, ids, weights);
}

// One warp per token (E <= kWarpRouteExperts).
__global__ void moe_route_warp_kernel(const float* __restrict__ logits, int64_t ld, int T, int E,
                                      int k, bool renormalize, int32_t* __restrict__ ids,
                                      float* __restrict__ weights) {
  pdl_begin();
  const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= T) return;
  route_token(logits + static_cast<int64_t>(t) * ld, E, k, renormalize,
              ids + static_cast<int64_t>(t) * k, weights + static_cast<int64_t>(t) * k);
}

// One block per token, for more experts than a warp routes: the softmax
// (fixed-order block reductions), then the top k in k rounds of block-wide
// arg-max (ties to the lower expert).
__global__ void moe_route_kernel(const float* __restrict__ logits, int64_t ld, int E, int k,
                                 bool renormalize, int32_t* __restrict__ ids,
                                 float* __restrict__ weights) {
  pdl_begin();
  extern __shared__ float p[];  // [E] probabilities; -1 once chosen
  __shared__ float red[32];
  __shared__ int red_e[32];
  __shared__ float chosen[kMaxTopK];
  const int t = blockIdx.x;
  const float* row = logits + static_cast<int64_t>(t) * ld;
  float mx = -INFINITY;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    p[e] = row[e];
    mx = fmaxf(mx, p[e]);
  }
  mx = block_max(mx, red);
  float s = 0.0f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    p[e] = expf(p[e] - mx);
    s += p[e];
  }
  s = block_sum(s, red);
  for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = p[e] / s;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int j = 0; j < k; ++j) {
    float bp = -2.0f;
    int be = INT_MAX;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const float pe = rank_key(p[e]);
      if (pe >= -1.0f && ahead(pe, e, bp, be)) {
        bp = pe;
        be = e;
      }
    }
    warp_ahead_max(bp, be);
    if (lane == 0) {
      red[warp] = bp;
      red_e[warp] = be;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < nw; ++w)
        if (ahead(red[w], red_e[w], bp, be)) {
          bp = red[w];
          be = red_e[w];
        }
      ids[static_cast<int64_t>(t) * k + j] = be;
      chosen[j] = bp;
      p[be] = -2.0f;  // below every candidate: chosen
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += chosen[j];
    for (int j = 0; j < k; ++j)
      weights[static_cast<int64_t>(t) * k + j] = renormalize ? chosen[j] / sum : chosen[j];
  }
}

// The n = T*k pairs of ids grouped by expert, by the whole block: per-expert
// counts (shared-memory atomics), their prefix sums and the list of experts
// with rows (warp 0, in expert order), then each pair's row in its
// expert's group. counts: 2E ints of shared memory.
__device__ __forceinline__ void group_pairs(const int32_t* ids, int n, int k, int E,
                                            const MoeGroups& g, int32_t* counts) {
  int32_t* cursor = counts + E;
  __shared__ int n_active;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&counts[ids[i]], 1);
  __syncthreads();
  if (threadIdx.x < 32) {
    // Warp 0: the prefix sums and the active list, 32 experts a step.
    const int lane = threadIdx.x;
    int acc = 0, na = 0;
    for (int base = 0; base < E; base += 32) {
      const int e = base + lane;
      const int c = e < E ? counts[e] : 0;
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const unsigned has = __ballot_sync(0xffffffffu, c > 0);
      if (e < E) {
        g.offsets[e] = acc + incl - c;
        cursor[e] = acc + incl - c;
        if (c > 0) g.active[na + __popc(has & ((1u << lane) - 1))] = e;
      }
      acc += __shfl_sync(0xffffffffu, incl, 31);
      na += __popc(has);
    }
    if (lane == 0) {
      g.offsets[E] = acc;
      n_active = na;
    }
  }
  __syncthreads();
  for (int a = n_active + threadIdx.x; a < E; a += blockDim.x) g.active[a] = -1;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int e = ids[i];
    const int r = atomicAdd(&cursor[e], 1);
    g.row_token[r] = i / k;
    g.row_expert[r] = e;
    g.pair_row[i] = r;
  }
}

__global__ void moe_group_kernel(const int32_t* __restrict__ ids, int n, int k, int E,
                                 MoeGroups g) {
  pdl_begin();
  extern __shared__ int32_t counts[];  // [E] counts, then [E] cursors
  group_pairs(ids, n, k, E, g, counts);
}

// Router logits [T, E] (row stride E). Tiled (many tokens): block
// (blockIdx.x: 8 tokens, blockIdx.y: 16 experts), a 4-expert x 8-token tile
// per warp (the warps share the tokens' rows through L1). Otherwise block
// (blockIdx.x: kItemTokens tokens, blockIdx.y: kLogitsWarps experts), one
// item a warp.
template <class T, bool kTiled>
__global__ void moe_router_logits_kernel(const T* __restrict__ h, int64_t ldh,
                                         const T* __restrict__ router, int ntok, int E, int H,
                                         float* __restrict__ logits) {
  pdl_begin();
  const int warp = threadIdx.x >> 5;
  if constexpr (kTiled) {
    constexpr int NE = kTileExperts, NT = kTileTokens;
    const int t = blockIdx.x * NT, e = (blockIdx.y * kLogitsWarps + warp) * NE;
    if (e >= E) return;
    const int nt = min(NT, ntok - t), ne = min(NE, E - e);
    float out[NE][NT];
    router_tile<T, NE, NT, 1>(h + static_cast<int64_t>(t) * ldh, ldh, nt,
                              router + static_cast<int64_t>(e) * H, ne, H, out);
    store_logits(out, logits, E, t, nt, e, ne);
  } else {
    constexpr int NT = kItemTokens;
    const int t = blockIdx.x * NT, e = blockIdx.y * kLogitsWarps + warp;
    if (e >= E) return;
    const int nt = min(NT, ntok - t);
    router_items(h + static_cast<int64_t>(t) * ldh, ldh, router, nt, e, 1, E, H,
                 logits + static_cast<int64_t>(t) * E, 0, 1);
  }
}

// One element through L2 (ld.cg): for activations read before the
// dependency wait (never a stale L1 line).
__device__ __forceinline__ float ldcg_elem(const float* p) { return __ldcg(p); }
__device__ __forceinline__ bf16 ldcg_elem(const bf16* p) {
  const unsigned short u = __ldcg(reinterpret_cast<const unsigned short*>(p));
  return __ushort_as_bfloat16(u);
}

// The whole front for up to kFrontMaxTokens tokens in one launch: block b
// computes the logits of experts b*kFrontExperts .. for every token (the
// order of router_tile), and the last block to finish (a ticket counter,
// left at zero for the next launch) routes every token (a warp each) and
// groups the pairs.
// note: the logits go through global memory between the blocks: each block
// fences its stores before taking its ticket, and the last block reads them
// with ld.cg (L2, never a stale L1 line).
// note: the router rows are constants: each warp asks L2 for its experts'
// rows before the dependency wait, while the kernel before (add_rmsnorm)
// runs, so the loads behind the wait find them there.
template <class T>
__global__ void moe_router_front_kernel(const T* __restrict__ h, int64_t ldh,
                                        const T* __restrict__ router, int ntok, int E, int H, int k,
                                        bool renormalize, float* logits, int32_t* ids,
                                        float* __restrict__ weights, MoeGroups g,
                                        unsigned* ticket) {
  extern __shared__ int32_t counts[];  // [2E] for group_pairs
  __shared__ bool last;
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int e0 = blockIdx.x * kFrontExperts, ne = min(kFrontExperts, E - e0);
  for (int e = e0 + warp; e < e0 + ne; e += nw)
    warp_prefetch_l2(router + static_cast<int64_t>(e) * H, static_cast<int64_t>(H) * sizeof(T));
  pdl_begin();
  router_items(h, ldh, router, ntok, e0, ne, E, H, logits, warp, nw);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int t = warp; t < ntok; t += nw)
    route_token(logits + static_cast<int64_t>(t) * E, E, k, renormalize,
                ids + static_cast<int64_t>(t) * k, weights + static_cast<int64_t>(t) * k);
  __syncthreads();
  group_pairs(ids, ntok * k, k, E, g, counts);
  if (threadIdx.x == 0) *ticket = 0u;
}

// Block (token blockIdx.x, columns blockIdx.y * kCombineThreads ..): the
// shared expert's gate (a fixed-order block dot product over all H, the
// same in every block of the token), then each column's sum over the
// token's experts in increasing expert index, plus the gated shared expert.
// note: one column per thread: a thread's k loads are independent and go
// out together (a block per token walking H in steps of 256 waited on one
// L2 round trip per step: 10 us at batch 1).
// note: the choices, their rows and h come from launches two or more back
// (moe.h), so they are read (through L2) and the gate computed before the
// dependency wait, which then guards only y and shared: the wait's release
// is followed by one round trip, the y loads.
template <class T>
__global__ void moe_combine_kernel(const float* __restrict__ y, int64_t ldy,
                                   const int32_t* __restrict__ ids,
                                   const float* __restrict__ weights,
                                   const int32_t* __restrict__ pair_row, int k, int H,
                                   const float* __restrict__ shared, int64_t lds,
                                   const T* __restrict__ h, int64_t ldh,
                                   const T* __restrict__ gate_w, T* __restrict__ out, int64_t ldo) {
  __shared__ float red[32];
  __shared__ int tid[kMaxTopK], srow[kMaxTopK];
  __shared__ float sw[kMaxTopK];
  const int64_t t = blockIdx.x;
  // The token's k choices, loaded together, then placed in increasing
  // expert order: choice j goes to its rank among them (a stable order: an
  // equal expert earlier in the list ranks first), all at once instead of
  // one thread's insertion sort.
  const int j = threadIdx.x;
  int my_id = 0, my_row = 0;
  float my_w = 0.0f;
  if (j < k) {
    my_id = __ldcg(ids + t * k + j);
    my_w = __ldcg(weights + t * k + j);
    my_row = __ldcg(pair_row + t * k + j);
    tid[j] = my_id;
  }
  float gate = 0.0f;
  if (shared != nullptr) {
    float s = 0.0f;
    for (int c = threadIdx.x; c < H; c += blockDim.x)
      s = fmaf(to_f(ldcg_elem(h + t * ldh + c)), to_f(gate_w[c]), s);
    gate = sigmoid(block_sum(s, red));
  }
  __syncthreads();
  if (j < k) {
    int rank = 0;
    for (int i = 0; i < k; ++i) rank += tid[i] < my_id || (tid[i] == my_id && i < j) ? 1 : 0;
    srow[rank] = my_row;
    sw[rank] = my_w;
  }
  __syncthreads();
  pdl_begin();
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c < H) {
    float acc = 0.0f;
    for (int r = 0; r < k; ++r) acc = fmaf(sw[r], y[static_cast<int64_t>(srow[r]) * ldy + c], acc);
    if (shared != nullptr) acc = fmaf(gate, shared[t * lds + c], acc);
    out[t * ldo + c] = from_f<T>(acc);
  }
}

// The experts' row groups of a grouped product: x rows gathered through
// row_token (gather) or already grouped.
dev::RowGroups expert_groups(const MoeGroups& g, bool gather, int64_t rows, bool settled) {
  dev::RowGroups groups;
  groups.offsets = g.offsets;
  groups.active = g.active;
  groups.row_source = gather ? g.row_token : nullptr;
  groups.rows = static_cast<int>(rows);  // all groups' rows together (a bound)
  groups.settled = settled;
  return groups;
}

void check_sizes(const char* what, int64_t T, int64_t E, int64_t k) {
  if (E < 1 || E > kMaxExperts || k < 1 || k > kMaxTopK || k > E || T * k > INT32_MAX)
    fail_message(std::string(what) + ": unsupported sizes: " + std::to_string(T) + " tokens, " +
                 std::to_string(E) + " experts, top " + std::to_string(k) +
                 " (expected 1 <= k <= 32, k <= experts <= 4096)");
}

}  // namespace

void moe_route(const float* logits, int64_t ld, int64_t T, int64_t E, int64_t k, bool renormalize,
               int32_t* ids, float* weights, cudaStream_t stream) {
  if (T == 0) return;
  check_sizes("moe_route", T, E, k);
  if (E <= kWarpRouteExperts) {
    constexpr int kWarps = 4;
    launch_kernel(moe_route_warp_kernel, dim3(static_cast<unsigned>((T + kWarps - 1) / kWarps)),
                  dim3(32 * kWarps), 0, stream, logits, ld, static_cast<int>(T),
                  static_cast<int>(E), static_cast<int>(k), renormalize, ids, weights);
    return;
  }
  launch_kernel(moe_route_kernel, dim3(static_cast<unsigned>(T)), dim3(128),
                static_cast<size_t>(E) * sizeof(float), stream, logits, ld, static_cast<int>(E),
                static_cast<int>(k), renormalize, ids, weights);
}

void moe_group(const int32_t* ids, int64_t T, int64_t k, int64_t E, const MoeGroups& g,
               cudaStream_t stream) {
  if (T == 0) return;
  check_sizes("moe_group", T, E, k);
  launch_kernel(moe_group_kernel, dim3(1), dim3(1024), static_cast<size_t>(2 * E) * sizeof(int32_t),
                stream, ids, static_cast<int>(T * k), static_cast<int>(k), static_cast<int>(E), g);
}

bool moe_router_front_supported(const void* h, int64_t ldh, const void* router, int64_t E,
                                int64_t H, int64_t elem_size) {
  const int64_t V = 16 / elem_size;
  return E >= 1 && E <= kWarpRouteExperts && H >= V && H % V == 0 && ldh % V == 0 &&
         H <= INT32_MAX && reinterpret_cast<uintptr_t>(h) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(router) % 16 == 0;
}

namespace {

// Fails with one message when the router's operands are not what
// moe_router_logits / moe_router_front take.
template <class T>
void check_router_operands(const char* what, const T* h, int64_t ldh, const T* router, int64_t E,
                           int64_t H) {
  if (!moe_router_front_supported(h, ldh, router, E, H, sizeof(T)))
    fail_message(std::string(what) + ": unsupported sizes or alignment: " + std::to_string(E) +
                 " experts, hidden " + std::to_string(H));
}

unsigned blocks_of(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

}  // namespace

template <class T>
void moe_router_logits(const T* h, int64_t ldh, const T* router, int64_t T_, int64_t E, int64_t H,
                       float* logits, cudaStream_t stream) {
  if (T_ == 0) return;
  if (T_ > INT32_MAX) fail_message("moe_router_logits: unsupported sizes");
  check_router_operands("moe_router_logits", h, ldh, router, E, H);
  if (T_ >= kTiledLogitsMinTokens)
    launch_kernel(moe_router_logits_kernel<T, true>,
                  dim3(blocks_of(T_, kTileTokens), blocks_of(E, kLogitsWarps * kTileExperts)),
                  dim3(32 * kLogitsWarps), 0, stream, h, ldh, router, static_cast<int>(T_),
                  static_cast<int>(E), static_cast<int>(H), logits);
  else
    launch_kernel(moe_router_logits_kernel<T, false>,
                  dim3(blocks_of(T_, kItemTokens), blocks_of(E, kLogitsWarps)),
                  dim3(32 * kLogitsWarps), 0, stream, h, ldh, router, static_cast<int>(T_),
                  static_cast<int>(E), static_cast<int>(H), logits);
}

template <class T>
void moe_router_front(const T* h, int64_t ldh, const T* router, int64_t T_, int64_t E, int64_t H,
                      int64_t k, bool renormalize, float* logits, int32_t* ids, float* weights,
                      const MoeGroups& g, unsigned* ticket, cudaStream_t stream) {
  if (T_ == 0) return;
  check_sizes("moe_router_front", T_, E, k);
  if (T_ > kFrontMaxTokens) {
    moe_router_logits<T>(h, ldh, router, T_, E, H, logits, stream);
    moe_route(logits, E, T_, E, k, renormalize, ids, weights, stream);
    moe_group(ids, T_, k, E, g, stream);
    return;
  }
  check_router_operands("moe_router_front", h, ldh, router, E, H);
  launch_kernel(moe_router_front_kernel<T>, dim3(blocks_of(E, kFrontExperts)), dim3(256),
                static_cast<size_t>(2 * E) * sizeof(int32_t), stream, h, ldh, router,
                static_cast<int>(T_), static_cast<int>(E), static_cast<int>(H), static_cast<int>(k),
                renormalize, logits, ids, weights, g, ticket);
}

template <class T, class Y>
void moe_expert_matmul(const T* x, int64_t ldx, bool gather, const WeightRef<T>& w, int64_t N,
                       int64_t K, Y* y, int64_t ldy, int64_t rows, const MoeGroups& g,
                       int64_t max_active, bool settled, cudaStream_t stream) {
  if (rows == 0 || N == 0) return;
  launch_warp_matmul<T, Y>("moe_expert_matmul", x, ldx, w, N, K, y, ldy,
                           expert_groups(g, gather, rows, settled), max_active, stream);
}

template <class T>
bool moe_expert_matmul_swiglu(const T* x, int64_t ldx, bool gather, const WeightRef<T>& w,
                              int64_t I, int64_t K, T* act, int64_t lda, int64_t rows,
                              const MoeGroups& g, int64_t max_active, cudaStream_t stream) {
  if (rows == 0 || I == 0) return true;
  check_weight_operands("moe_expert_matmul_swiglu", w, 2 * I, K, max_active);
  return launch_mma_matmul<T, T>(x, ldx, w, 2 * I, K, act, lda,
                                 expert_groups(g, gather, rows, false), max_active, I, stream);
}

template <class T>
void moe_combine(const float* y, int64_t ldy, const int32_t* ids, const float* weights,
                 const int32_t* pair_row, int64_t tokens, int64_t k, int64_t H, const float* shared,
                 int64_t lds, const T* h, int64_t ldh, const T* gate_w, T* out, int64_t ldo,
                 cudaStream_t stream) {
  if (tokens == 0) return;
  if (k < 1 || k > kMaxTopK || H > INT32_MAX || tokens > INT32_MAX)
    fail_message("moe_combine: unsupported sizes");
  launch_kernel(moe_combine_kernel<T>,
                dim3(static_cast<unsigned>(tokens),
                     static_cast<unsigned>((H + kCombineThreads - 1) / kCombineThreads)),
                dim3(kCombineThreads), 0, stream, y, ldy, ids, weights, pair_row,
                static_cast<int>(k), static_cast<int>(H), shared, lds, h, ldh, gate_w, out, ldo);
}

#define QTK_INSTANTIATE(T, Y)                                                                     \
  template void moe_expert_matmul<T, Y>(const T*, int64_t, bool, const WeightRef<T>&, int64_t,    \
                                        int64_t, Y*, int64_t, int64_t, const MoeGroups&, int64_t, \
                                        bool, cudaStream_t);
QTK_INSTANTIATE(float, float)
QTK_INSTANTIATE(bf16, bf16)
QTK_INSTANTIATE(bf16, float)
#undef QTK_INSTANTIATE
template void moe_router_logits<float>(const float*, int64_t, const float*, int64_t, int64_t,
                                       int64_t, float*, cudaStream_t);
template void moe_router_logits<bf16>(const bf16*, int64_t, const bf16*, int64_t, int64_t, int64_t,
                                      float*, cudaStream_t);
template void moe_router_front<float>(const float*, int64_t, const float*, int64_t, int64_t,
                                      int64_t, int64_t, bool, float*, int32_t*, float*,
                                      const MoeGroups&, unsigned*, cudaStream_t);
template void moe_router_front<bf16>(const bf16*, int64_t, const bf16*, int64_t, int64_t, int64_t,
                                     int64_t, bool, float*, int32_t*, float*, const MoeGroups&,
                                     unsigned*, cudaStream_t);
template bool moe_expert_matmul_swiglu<float>(const float*, int64_t, bool, const WeightRef<float>&,
                                              int64_t, int64_t, float*, int64_t, int64_t,
                                              const MoeGroups&, int64_t, cudaStream_t);
template bool moe_expert_matmul_swiglu<bf16>(const bf16*, int64_t, bool, const WeightRef<bf16>&,
                                             int64_t, int64_t, bf16*, int64_t, int64_t,
                                             const MoeGroups&, int64_t, cudaStream_t);
template void moe_combine<float>(const float*, int64_t, const int32_t*, const float*,
                                 const int32_t*, int64_t, int64_t, int64_t, const float*, int64_t,
                                 const float*, int64_t, const float*, float*, int64_t,
                                 cudaStream_t);
template void moe_combine<bf16>(const float*, int64_t, const int32_t*, const float*, const int32_t*,
                                int64_t, int64_t, int64_t, const float*, int64_t, const bf16*,
                                int64_t, const bf16*, bf16*, int64_t, cudaStream_t);

}  // namespace qtk::cuda
