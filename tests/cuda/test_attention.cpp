// Paged attention and the KV cache write: against the float64 reference, and
// bit-identical rows across batch compositions, block sizes and chunkings.
#include <algorithm>
#include <numeric>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/reference.h"
#include "tests/cuda/rope_cases.h"

namespace qtk::cuda::test {
namespace {

// A sequence of a step: after the step its cache holds seq_len tokens, the
// last q_len of them new this step. Its values depend only on `seed`, so the
// same sequence placed in different batches sees the same data.
struct SeqSpec {
  int32_t seq_len, q_len;
  uint32_t seed;
};

struct Shape {
  int64_t hq, hkv, d;
};

template <class T>
struct AttnRun {
  std::vector<T> out;  // [T, Hq, D]
  Vec ref;             // float64 reference
  std::vector<int32_t> q_start;
};

// Position p of sequence `seed`: K, V rows [Hkv*D] and query rows [Hq*D].
std::vector<float> seq_rows(uint32_t seed, int64_t n, int64_t width, uint32_t salt) {
  return random_floats(n * width, -1.5f, 1.5f, seed * 7919u + salt);
}

// workspace: pass the optional split workspace (AttentionBatch::partials),
// so that decode-only batches of the bf16 path spread key tiles over blocks.
template <class T>
AttnRun<T> run_attention(const std::vector<SeqSpec>& seqs, int64_t block_size, const Shape& sh,
                         uint32_t layout_seed, bool workspace = true) {
  const int64_t kvw = sh.hkv * sh.d, qw = sh.hq * sh.d;
  HostBatch hb;
  hb.block_size = block_size;
  int64_t total_blocks = 0, tokens = 0, max_len = 0;
  for (const auto& s : seqs) {
    hb.max_blocks = std::max<int64_t>(hb.max_blocks, (s.seq_len + block_size - 1) / block_size);
    total_blocks += (s.seq_len + block_size - 1) / block_size;
    max_len = std::max<int64_t>(max_len, s.seq_len);
  }
  const int64_t num_blocks = total_blocks + 3;  // spare blocks stay poisoned
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(layout_seed));
  hb.block_table.assign(seqs.size() * hb.max_blocks, -1);
  hb.q_start.push_back(0);
  const size_t cache_elems = num_blocks * block_size * kvw;
  std::vector<T> kc(cache_elems, from_float<T>(NAN)), vc(cache_elems, from_float<T>(NAN));
  Vec kcd(cache_elems, 0.0), vcd(cache_elems, 0.0);
  const int64_t ldq = qw + 8, ldkv = kvw + 24;  // padded rows, as inside a fused qkv output
  std::vector<T> q, knew, vnew;
  std::vector<int64_t> slots;
  int64_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto& sp = seqs[s];
    for (int64_t b = 0; b < (sp.seq_len + block_size - 1) / block_size; ++b)
      hb.block_table[s * hb.max_blocks + b] = perm[next++];
    hb.seq_len.push_back(sp.seq_len);
    hb.q_start.push_back(hb.q_start.back() + sp.q_len);
    const auto K = to_device_type<T>(seq_rows(sp.seed, sp.seq_len, kvw, 1));
    const auto V = to_device_type<T>(seq_rows(sp.seed, sp.seq_len, kvw, 2));
    const auto Q = to_device_type<T>(seq_rows(sp.seed, sp.seq_len, qw, 3));
    for (int64_t p = 0; p < sp.seq_len; ++p) {
      const int64_t slot =
          int64_t(hb.block_table[s * hb.max_blocks + p / block_size]) * block_size + p % block_size;
      for (int64_t e = 0; e < kvw; ++e) {
        kcd[slot * kvw + e] = to_float(K[p * kvw + e]);
        vcd[slot * kvw + e] = to_float(V[p * kvw + e]);
      }
      if (p < sp.seq_len - sp.q_len) {  // history: already in the cache
        std::copy(&K[p * kvw], &K[p * kvw] + kvw, &kc[slot * kvw]);
        std::copy(&V[p * kvw], &V[p * kvw] + kvw, &vc[slot * kvw]);
      } else {  // new this step: written by kv_cache_write
        slots.push_back(slot);
        knew.insert(knew.end(), &K[p * kvw], &K[p * kvw] + kvw);
        knew.resize(knew.size() + (ldkv - kvw), from_float<T>(0));
        vnew.insert(vnew.end(), &V[p * kvw], &V[p * kvw] + kvw);
        vnew.resize(vnew.size() + (ldkv - kvw), from_float<T>(0));
        q.insert(q.end(), &Q[p * qw], &Q[p * qw] + qw);
        q.resize(q.size() + (ldq - qw), from_float<T>(0));
        ++tokens;
      }
    }
  }
  DeviceBuffer<T> kcache(kc), vcache(vc), qd(q), kd(knew), vd(vnew), out(tokens * qw);
  DeviceBuffer<int64_t> slotd(slots);
  DeviceBuffer<int32_t> qs(hb.q_start), sl(hb.seq_len), bt(hb.block_table);
  kv_cache_write<T>(kd.get(), ldkv, vd.get(), ldkv, tokens, sh.hkv, sh.d, slotd.get(), kcache.get(),
                    vcache.get(), nullptr);
  AttentionBatch b;
  b.num_seqs = static_cast<int64_t>(seqs.size());
  b.q_start = qs.get();
  b.seq_len = sl.get();
  b.block_table = bt.get();
  b.max_blocks = hb.max_blocks;
  b.block_size = block_size;
  b.total_tokens = tokens;
  b.max_seq_len = max_len;
  DeviceBuffer<float> partials(attention_partials_floats(tokens * sh.hq, sh.d));
  if (workspace) {
    b.partials = partials.get();
    b.partial_rows = tokens * sh.hq;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(sh.d));
  paged_attention<T>(qd.get(), ldq, kcache.get(), vcache.get(), out.get(), qw, b, sh.hq, sh.hkv,
                     sh.d, scale, nullptr);
  AttnRun<T> r;
  r.out = out.download();
  r.q_start = hb.q_start;
  Vec qdbl;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t e = 0; e < qw; ++e) qdbl.push_back(to_float(q[t * ldq + e]));
  r.ref = attention_ref(qdbl, kcd, vcd, hb, sh.hq, sh.hkv, sh.d, scale);
  return r;
}

template <class T>
class AttentionTest : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(AttentionTest, ActTypes);

const std::vector<Shape> kShapes = {{8, 2, 64}, {16, 8, 128}, {8, 2, 256}, {4, 4, 32}};

TYPED_TEST(AttentionTest, MixedPrefillAndDecodeMatchesReference) {
  using T = TypeParam;
  // A prefill chunk continuing a cached prefix, a fresh prompt, decode tokens
  // with short and long contexts, and a one-token prompt.
  const std::vector<SeqSpec> seqs = {{57, 37, 1}, {23, 23, 2}, {300, 1, 3}, {1, 1, 4}, {77, 1, 5}};
  for (const auto& sh : kShapes)
    for (int64_t bs : {16, 5}) {
      const auto r = run_attention<T>(seqs, bs, sh, 99);
      // note: bf16 here also rounds q, K, V and the output, with attention
      // weights over up to 300 keys: 1e-2 is still far below a wrong result.
      EXPECT_LT(rel_error(r.out, r.ref), tolerance<T>()) << "D " << sh.d << " bs " << bs;
    }
}

// Rows of sequence `which` in a run.
template <class T>
std::vector<T> rows_of(const AttnRun<T>& r, size_t which, int64_t width) {
  return std::vector<T>(r.out.begin() + r.q_start[which] * width,
                        r.out.begin() + r.q_start[which + 1] * width);
}

TYPED_TEST(AttentionTest, RowsIdenticalAcrossBatchAndBlockLayout) {
  using T = TypeParam;
  for (const auto& sh : kShapes) {
    const int64_t w = sh.hq * sh.d;
    const SeqSpec probe{130, 40, 7}, dec{211, 1, 8};
    const auto alone = run_attention<T>({probe}, 16, sh, 1);
    const auto dec_alone = run_attention<T>({dec}, 16, sh, 1);
    const auto mixed =
        run_attention<T>({{64, 1, 9}, dec, {33, 33, 10}, probe, {500, 1, 11}}, 16, sh, 2);
    const auto other_blocks = run_attention<T>({probe, {12, 12, 12}, dec}, 3, sh, 3);
    const auto a = rows_of(alone, 0, w), da = rows_of(dec_alone, 0, w);
    const auto m = rows_of(mixed, 3, w), dm = rows_of(mixed, 1, w);
    const auto o = rows_of(other_blocks, 0, w), dob = rows_of(other_blocks, 2, w);
    EXPECT_TRUE(bitwise_equal(a.data(), m.data(), a.size())) << "D " << sh.d;
    EXPECT_TRUE(bitwise_equal(a.data(), o.data(), a.size())) << "D " << sh.d;
    EXPECT_TRUE(bitwise_equal(da.data(), dm.data(), da.size())) << "D " << sh.d;
    EXPECT_TRUE(bitwise_equal(da.data(), dob.data(), da.size())) << "D " << sh.d;
  }
}

TYPED_TEST(AttentionTest, RowsIdenticalAcrossPromptChunking) {
  using T = TypeParam;
  const Shape sh{8, 2, 128};
  const int64_t w = sh.hq * sh.d;
  const uint32_t seed = 21;
  const auto whole = run_attention<T>({{100, 100, seed}}, 16, sh, 4);
  std::vector<T> pieces;
  int32_t done = 0;
  for (int32_t chunk : {37, 1, 7, 55}) {
    const auto r = run_attention<T>({{done + chunk, chunk, seed}, {40, 1, 30}}, 16, sh, 5 + done);
    const auto rows = rows_of(r, 0, w);
    pieces.insert(pieces.end(), rows.begin(), rows.end());
    done += chunk;
  }
  ASSERT_EQ(done, 100);
  ASSERT_EQ(pieces.size(), whole.out.size());
  EXPECT_TRUE(bitwise_equal(pieces.data(), whole.out.data(), pieces.size()));
}

// A decode step (one token per sequence) with the split workspace equals the
// same step without it, bit for bit, for contexts of 1 to kAttentionSplitTiles
// key tiles and past them (no split); and it matches the reference.
TYPED_TEST(AttentionTest, DecodeSplitOverKeyTilesEqualsOneBlockPerRow) {
  using T = TypeParam;
  const int most = static_cast<int>(64 * kAttentionSplitTiles);  // keys the split takes
  const std::vector<SeqSpec> dec = {{1, 1, 41},    {64, 1, 42},       {65, 1, 43},   {300, 1, 44},
                                    {1000, 1, 45}, {most - 1, 1, 46}, {most, 1, 47}, {129, 1, 48}};
  const std::vector<SeqSpec> longer = {{most + 1, 1, 49}, {7, 1, 50}};
  for (const auto& sh : kShapes)
    for (const auto* batch : {&dec, &longer}) {
      const auto with = run_attention<T>(*batch, 16, sh, 50, true);
      const auto without = run_attention<T>(*batch, 16, sh, 50, false);
      ASSERT_EQ(with.out.size(), without.out.size());
      EXPECT_TRUE(bitwise_equal(with.out.data(), without.out.data(), with.out.size()))
          << "D " << sh.d << " contexts up to " << (*batch)[0].seq_len;
      EXPECT_LT(rel_error(with.out, with.ref), tolerance<T>()) << "D " << sh.d;
    }
}

// ---- decode_attention: the whole decode attention in one launch ---------------

struct FusedCase {
  int64_t hq, hkv, d;
  RopeParams rope;
  bool gate;        // Qwen3.5's sigmoid output gate
  bool qkv_layout;  // Qwen3's [q | k | v] rows (also checked against qkv_rope_cache)
};

// One decode step both ways: the separate kernels (qk_norm_rope on q and k,
// kv_cache_write, paged_attention with the split workspace, sigmoid_mul) and
// decode_attention. The contexts (history in a shuffled, NaN-poisoned
// cache) span 1 key to kAttentionSplitTiles tiles; one padding row (slot -1)
// must write nothing. Returns false when decode_attention declined. form:
// decode_attention's; walked: whether it took the walk
// (decode_attention_walks).
bool fused_matches_separate(const FusedCase& fc, const std::vector<int32_t>& lens,
                            int64_t block_size, uint32_t seed, std::string* why,
                            bool* walked = nullptr,
                            AttentionBatch::DecodeForm form = AttentionBatch::DecodeForm::kAuto) {
  const int64_t D = fc.d, hq = fc.hq, hkv = fc.hkv, kvw = hkv * D, qw = hq * D;
  const int64_t S = static_cast<int64_t>(lens.size()) + 1;  // + the padding row
  // Row layout: [q | gate | k | v] (Qwen3.5) or [q | k | v] (Qwen3), padded.
  const int64_t q_off = 0, g_off = qw, k_off = fc.gate ? 2 * qw : qw, v_off = k_off + kvw;
  const int64_t ld = v_off + kvw + 8;
  int64_t mb = 1;
  for (int32_t n : lens) mb = std::max<int64_t>(mb, (n + block_size - 1) / block_size);
  const int64_t num_blocks = S * mb + 3;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<int32_t> bt(S * mb), seq_len, q_start, pos(3 * S);
  std::vector<int64_t> slot(S);
  for (int64_t i = 0; i < S * mb; ++i) bt[i] = perm[i];
  const size_t cache_elems = num_blocks * block_size * kvw;
  std::vector<bf16> kc(cache_elems, from_float<bf16>(NAN)), vc = kc;
  for (int64_t s = 0; s < S; ++s) {
    const int32_t n = s + 1 < S ? lens[s] : 1;
    seq_len.push_back(n);
    q_start.push_back(static_cast<int32_t>(s));
    for (int a = 0; a < 3; ++a) pos[a * S + s] = n - 1 + 5 * a;  // M-RoPE axes differ
    slot[s] = s + 1 < S
                  ? int64_t(bt[s * mb + (n - 1) / block_size]) * block_size + (n - 1) % block_size
                  : -1;
    const auto hist = to_device_type<bf16>(random_floats(2 * n * kvw, -1.5f, 1.5f, seed + s));
    for (int32_t p = 0; p + 1 < n; ++p) {  // the history; key n - 1 is the step's
      const int64_t sl = int64_t(bt[s * mb + p / block_size]) * block_size + p % block_size;
      std::copy(&hist[p * kvw], &hist[(p + 1) * kvw], &kc[sl * kvw]);
      std::copy(&hist[(n + p) * kvw], &hist[(n + p + 1) * kvw], &vc[sl * kvw]);
    }
  }
  q_start.push_back(static_cast<int32_t>(S));
  const auto raw = to_device_type<bf16>(random_floats(S * ld, -2.0f, 2.0f, seed + 101));
  const auto qn = random_floats(D, 0.5f, 1.5f, seed + 102),
             kn = random_floats(D, 0.5f, 1.5f, seed + 103);
  DeviceBuffer<float> qnd(qn), knd(kn);
  DeviceBuffer<int32_t> posd(pos), qsd(q_start), sld(seq_len), btd(bt);
  DeviceBuffer<int64_t> slotd(slot);
  DeviceBuffer<float2> table(64 * (fc.rope.rotary_dim / 2));
  RopeParams rope = fc.rope;
  rope_table_build(table.get(), 64, rope, nullptr);  // positions past 64: computed inline
  rope.table = table.get();
  rope.table_positions = 64;
  AttentionBatch b;
  b.num_seqs = S;
  b.q_start = qsd.get();
  b.seq_len = sld.get();
  b.block_table = btd.get();
  b.max_blocks = mb;
  b.block_size = block_size;
  b.total_tokens = S;
  b.max_seq_len = *std::max_element(seq_len.begin(), seq_len.end());
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float eps = 1e-6f;
  struct Result {
    std::vector<bf16> out, k, v;
  };
  auto run = [&](bool fused, bool qkv_kernel, bool* took) {
    DeviceBuffer<bf16> x(raw), kd(kc), vd(vc), out(S * qw);
    DeviceBuffer<float> partials(attention_partials_floats(S * hq, D));
    AttentionBatch bb = b;
    bb.decode_form = form;
    bb.partials = partials.get();
    bb.partial_rows = S * hq;
    bf16* q = x.get() + q_off;
    bf16* k = x.get() + k_off;
    bf16* v = x.get() + v_off;
    const bf16* g = fc.gate ? x.get() + g_off : nullptr;
    if (fused) {
      if (walked != nullptr) *walked = decode_attention_walks(bb, hq, hkv, D);
      DecodeAttentionInput in;
      in.q = q;
      in.k = k;
      in.v = v;
      in.gate = g;
      in.ldq = in.ldk = in.ldv = in.ldg = ld;
      in.q_norm = qnd.get();
      in.k_norm = knd.get();
      in.eps = eps;
      in.positions = posd.get();
      in.rope = rope;
      in.slot_mapping = slotd.get();
      *took =
          decode_attention(in, kd.get(), vd.get(), out.get(), qw, bb, hq, hkv, D, scale, nullptr);
    } else {
      if (qkv_kernel) {
        qkv_rope_cache<bf16>(q, ld, S, hq, hkv, D, qnd.get(), knd.get(), eps, posd.get(), rope,
                             slotd.get(), kd.get(), vd.get(), nullptr);
      } else {
        qk_norm_rope<bf16>(q, ld, S, hq, D, qnd.get(), eps, posd.get(), rope, nullptr);
        qk_norm_rope<bf16>(k, ld, S, hkv, D, knd.get(), eps, posd.get(), rope, nullptr);
        kv_cache_write<bf16>(k, ld, v, ld, S, hkv, D, slotd.get(), kd.get(), vd.get(), nullptr);
      }
      paged_attention<bf16>(q, ld, kd.get(), vd.get(), out.get(), qw, bb, hq, hkv, D, scale,
                            nullptr);
      if (g != nullptr) sigmoid_mul<bf16>(out.get(), qw, g, ld, S, qw, nullptr);
    }
    return Result{out.download(), kd.download(), vd.download()};
  };
  bool took = false;
  const Result one = run(true, false, &took);
  if (!took) return false;
  std::vector<Result> refs = {run(false, false, nullptr)};
  if (fc.qkv_layout) refs.push_back(run(false, true, nullptr));
  const size_t real = (S - 1) * qw;  // the padding row's output is not compared
  for (const Result& r : refs) {
    if (!bitwise_equal(one.out.data(), r.out.data(), real)) *why += " out differs;";
    if (!bitwise_equal(one.k.data(), r.k.data(), cache_elems)) *why += " K cache differs;";
    if (!bitwise_equal(one.v.data(), r.v.data(), cache_elems)) *why += " V cache differs;";
  }
  for (size_t i = 0; i < real; ++i)
    if (!std::isfinite(to_float(one.out[i]))) {
      *why += " non-finite output;";
      break;
    }
  return true;
}

TEST(DecodeAttention, OneLaunchEqualsSeparateKernels) {
  const RopeParams plain = plain_rope(), mrope = qwen35_mrope();
  RopeParams r64 = plain;
  r64.rotary_dim = 64;
  const std::vector<FusedCase> cases = {
      {16, 8, 128, plain, false, true},  // Qwen3-0.6B
      {8, 2, 256, mrope, true, false},   // Qwen3.5-0.8B
      {32, 2, 128, plain, false, true},  // group 16
      {4, 4, 64, r64, true, false},      // group 1, D 64
  };
  const int most = static_cast<int>(64 * kAttentionSplitTiles);
  const std::vector<int32_t> lens = {1, 2, 63, 64, 65, 129, 300, most - 1, most, 77};
  for (const auto& fc : cases)
    for (const int64_t bs : {int64_t{16}, int64_t{5}}) {
      std::string why;
      bool walked = true;
      ASSERT_TRUE(
          fused_matches_separate(fc, lens, bs, 900 + static_cast<uint32_t>(fc.d), &why, &walked))
          << "decode_attention declined D " << fc.d << " group " << fc.hq / fc.hkv;
      EXPECT_FALSE(walked) << "contexts of 32 tiles split over blocks";
      EXPECT_TRUE(why.empty()) << "D " << fc.d << " group " << fc.hq / fc.hkv << " block size "
                               << bs << ":" << why;
    }
}

// The walk (one block per sequence and kv head computes every key tile and
// the merge; by default where those blocks fill half the GPU): the same bits as the
// separate kernels, whose attention splits the tiles over blocks and merges
// them in another launch. Contexts up to 8 tiles, so that a group of warps
// reuses its K/V slots (tiles past the first 2 per group) and the step's new
// key lands in a reused slot; GQA groups 1 to 16 (2 or 3 warp groups by
// shared memory); D 256 does not fit and splits.
TEST(DecodeAttention, ShortContextsWalkedInOneBlockEqualSeparateKernels) {
  const RopeParams plain = plain_rope(), mrope = qwen35_mrope();
  RopeParams r64 = plain;
  r64.rotary_dim = 64;
  struct WalkCase {
    FusedCase fc;
    bool walks;
  };
  const std::vector<WalkCase> cases = {
      {{16, 8, 128, plain, false, true}, true},  // Qwen3-0.6B: 3 groups of warps
      {{32, 4, 128, plain, false, true}, true},  // Qwen3-30B-A3B: group 8, 2 groups
      {{32, 2, 128, plain, false, true}, true},  // group 16
      {{4, 4, 64, r64, true, false}, true},      // group 1, D 64, gated
      {{8, 2, 256, mrope, true, false}, false},  // Qwen3.5-0.8B: D 256 splits
  };
  const std::vector<std::vector<int32_t>> lens = {
      {1, 2, 63, 64, 65, 129, 300, 447, 449, 511, 512, 77, 190},
      {512},
      {5},
      {130, 385},
  };
  for (const auto& wc : cases)
    for (const auto& l : lens)
      for (const int64_t bs : {int64_t{16}, int64_t{5}}) {
        std::string why;
        bool walked = false;
        ASSERT_TRUE(fused_matches_separate(wc.fc, l, bs, 700 + static_cast<uint32_t>(l.size()),
                                           &why, &walked, AttentionBatch::DecodeForm::kWalk))
            << "decode_attention declined D " << wc.fc.d;
        EXPECT_EQ(walked, wc.walks) << "D " << wc.fc.d << " group " << wc.fc.hq / wc.fc.hkv;
        EXPECT_TRUE(why.empty()) << "D " << wc.fc.d << " group " << wc.fc.hq / wc.fc.hkv
                                 << " block size " << bs << " lens ending " << l.back() << ":"
                                 << why;
      }
  // More (sequence, kv head) pairs than SMs: the walk forced takes one group
  // of warps a block (several blocks an SM, several waves), D 256 included.
  std::vector<int32_t> wide;
  for (int i = 0; i < 150; ++i) wide.push_back(1 + (i * 193 + 37) % 512);
  for (const auto& wc : cases) {
    std::string why;
    bool walked = false;
    ASSERT_TRUE(fused_matches_separate(wc.fc, wide, 16, 555, &why, &walked,
                                       AttentionBatch::DecodeForm::kWalk));
    EXPECT_TRUE(walked) << "D " << wc.fc.d << " group " << wc.fc.hq / wc.fc.hkv << " wide batch";
    EXPECT_TRUE(why.empty()) << "D " << wc.fc.d << " group " << wc.fc.hq / wc.fc.hkv
                             << " wide batch:" << why;
  }
  // By default a batch of up to 4 blocks an SM walks with one group of warps
  // (D <= 128); past that it splits.
  {
    const FusedCase qwen3 = cases[0].fc;  // 8 kv heads
    for (const int n : {40, 150}) {
      std::string why;
      bool walked = false;
      ASSERT_TRUE(fused_matches_separate(
          qwen3, std::vector<int32_t>(wide.begin(), wide.begin() + n), 16, 556, &why, &walked));
      EXPECT_EQ(walked, n == 40) << n << " sequences";
      EXPECT_TRUE(why.empty()) << n << " sequences:" << why;
    }
  }
  // By default contexts within 2 tiles walk at any batch.
  for (const auto& wc : cases) {
    std::string why;
    bool walked = false;
    ASSERT_TRUE(fused_matches_separate(wc.fc, {5, 64, 100, 128}, 16, 77, &why, &walked));
    EXPECT_EQ(walked, wc.walks) << "D " << wc.fc.d << " group " << wc.fc.hq / wc.fc.hkv;
    EXPECT_TRUE(why.empty()) << "D " << wc.fc.d << ":" << why;
  }
}

// Where the one-launch form does not apply it launches nothing and says so.
TEST(DecodeAttention, DeclinesWhatItDoesNotCover) {
  RopeParams rope;
  rope.rotary_dim = 32;  // rotate_half pairs 16 apart: across lanes
  rope.theta = 1e6;
  std::string why;
  EXPECT_FALSE(fused_matches_separate({8, 2, 64, rope, false, true}, {5, 70}, 16, 3, &why));
  rope.rotary_dim = 64;
  const int past = static_cast<int>(64 * kAttentionSplitTiles) + 1;  // no split: a walk
  EXPECT_FALSE(fused_matches_separate({8, 2, 64, rope, false, true}, {past}, 16, 4, &why));
  EXPECT_TRUE(why.empty()) << why;
}

TEST(AttentionErrors, RejectsUnsupportedShapes) {
  AttentionBatch b;
  b.total_tokens = 1;
  b.max_seq_len = 10;
  EXPECT_THROW(
      paged_attention<float>(nullptr, 0, nullptr, nullptr, nullptr, 0, b, 8, 3, 128, 1.0f, nullptr),
      std::exception);
  b.max_seq_len = 0;
  EXPECT_THROW(
      paged_attention<float>(nullptr, 0, nullptr, nullptr, nullptr, 0, b, 8, 2, 128, 1.0f, nullptr),
      std::exception);
}

// Contexts longer than the scores shared memory holds at once
// (paged_attention_max_context(), 48K keys) are walked in tiles: f32 rows
// at 50,000+ keys (a 3-token prefill chunk, a decode token) against the
// float64 reference, and the same rows bit-identical alone and next to a
// short sequence.
TEST(AttentionLongContext, TiledScoresMatchReferenceAndBatch) {
  const int64_t over = paged_attention_max_context();
  const Shape sh{4, 2, 32};
  const std::vector<SeqSpec> both = {{static_cast<int32_t>(over + 1000), 3, 11},
                                     {static_cast<int32_t>(over + 77), 1, 12},
                                     {40, 5, 13}};
  const AttnRun<float> r = run_attention<float>(both, 16, sh, 3, false);
  EXPECT_LT(rel_error(r.out, r.ref), 1e-5);
  const int64_t width = sh.hq * sh.d;
  for (size_t i = 0; i < 2; ++i) {
    const AttnRun<float> alone = run_attention<float>({both[i]}, 16, sh, 5, false);
    const std::vector<float> rows = rows_of(r, i, width);
    ASSERT_EQ(rows.size(), alone.out.size());
    EXPECT_TRUE(bitwise_equal(rows.data(), alone.out.data(), rows.size())) << "sequence " << i;
  }
}

}  // namespace
}  // namespace qtk::cuda::test
