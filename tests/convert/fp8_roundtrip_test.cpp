// FP8 checkpoints through convert (issue 23), checked against the source
// safetensors read directly: `--dtype keep` keeps every e4m3 byte and gives
// every weight the scale of its source block (through the fused layouts,
// whose row blocks need not line up with the source's); `--dtype f32|bf16|f16`
// store each weight fp8 x scale rounded once (reference computed here in
// double, independently of convert/dtype_convert.cpp).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "convert/dtype_convert.h"
#include "convert_test_util.h"
#include "core/dtype.h"
#include "loaders/safetensors.h"
#include "pack/pack.h"

namespace qtk {
namespace {

using testing::TempDir;

const char* const kModel = "tests/data/models/qwen3-fp8-tiny";

// One source weight (HF layout) with its block scales, read from the file.
struct SourceWeight {
  const TensorView* w = nullptr;
  const TensorView* s = nullptr;
  // fp8 value x scale, exactly (4 x 24 significant bits fit in a double).
  double value(int64_t r, int64_t c) const {
    return static_cast<double>(fp8_e4m3_to_f32(byte(r, c))) * scale(r, c);
  }
  float scale(int64_t r, int64_t c) const {
    float sc;
    std::memcpy(&sc, static_cast<const uint8_t*>(s->data) + 4 * ((r / 128) * s->shape[1] + c / 128),
                4);
    return sc;
  }
  uint8_t byte(int64_t r, int64_t c) const { return w->as<uint8_t>()[r * w->shape[1] + c]; }
};

class Fp8Source {
 public:
  Fp8Source() : file_(SafetensorsFile::open(testing::source_path(kModel) + "/model.safetensors")) {}
  SourceWeight get(const std::string& name) const {
    SourceWeight sw;
    sw.w = &file_->find("model." + name + ".weight")->view;
    sw.s = &file_->find("model." + name + ".weight_scale_inv")->view;
    EXPECT_EQ(sw.w->dtype, DType::F8_E4M3);
    return sw;
  }

 private:
  std::unique_ptr<SafetensorsFile> file_;
};

// Pack tensor rows -> (source weight, its row): the fused layouts.
struct RowMap {
  std::vector<std::pair<SourceWeight, int64_t>> rows;
};

RowMap row_map(const Fp8Source& src, const std::string& pack_name) {
  RowMap m;
  auto add = [&](const std::string& n) {
    SourceWeight w = src.get(n);
    for (int64_t r = 0; r < w.w->shape[0]; ++r) m.rows.push_back({w, r});
  };
  const std::string layer = pack_name.substr(0, pack_name.find('.', 7) + 1);  // "layers.N."
  if (pack_name.ends_with("qkv_proj")) {
    add(layer + "self_attn.q_proj"), add(layer + "self_attn.k_proj"),
        add(layer + "self_attn.v_proj");
  } else if (pack_name.ends_with("gate_up_proj")) {
    add(layer + "mlp.gate_proj"), add(layer + "mlp.up_proj");
  } else {
    add(pack_name);
  }
  return m;
}

std::unique_ptr<Pack> convert_to(const TempDir& tmp, const std::string& dtype) {
  ConvertOptions opt;
  opt.input = testing::source_path(kModel);
  opt.output = tmp.file(dtype + ".pack");
  opt.matrix_dtype = parse_matrix_dtype(dtype);
  convert_checkpoint(opt);
  return Pack::open(opt.output);
}

const char* const kFp8Matrices[] = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"};

std::vector<std::string> fp8_pack_matrices() {
  std::vector<std::string> v;
  for (int l = 0; l < 2; ++l) {
    for (const char* m : kFp8Matrices) {
      const std::string mat = m;
      const std::string sub = mat == "qkv_proj" || mat == "o_proj" ? "self_attn." : "mlp.";
      v.push_back("layers." + std::to_string(l) + "." + sub + mat);
    }
  }
  return v;
}

TEST(Fp8Convert, KeepStoresEveryByteAndTheScaleOfItsSourceBlock) {
  TempDir tmp;
  const auto pack = convert_to(tmp, "keep");
  const Fp8Source src;
  ASSERT_EQ(pack->fp8_tensors().size(), 8u);
  EXPECT_TRUE(pack->has_transform("fp8_block_scales"));
  EXPECT_FALSE(pack->has_transform("dequantize_fp8"));
  const auto& q = pack->manifest()["quantization"];
  EXPECT_EQ(q["method"], "fp8");
  EXPECT_EQ(q["fmt"], "e4m3");
  EXPECT_EQ(q["source_weight_block_size"], nlohmann::json::array({128, 128}));
  for (const std::string& name : fp8_pack_matrices()) {
    SCOPED_TRACE(name);
    const TensorView& w = pack->tensor(name);
    ASSERT_EQ(w.dtype, DType::F8_E4M3);
    const PackFp8Scales* s = pack->fp8_scales(name);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->scale_name, name + ".scale");
    // note: intermediate 320: gate rows end at pack row 320, not a multiple
    // of 128, so the fused gate_up keeps its scales per 64 rows.
    EXPECT_EQ(s->block_rows, name.ends_with("gate_up_proj") ? 64 : 128);
    EXPECT_EQ(s->block_cols, 128);
    const RowMap m = row_map(src, name);
    const int64_t cols = w.shape[1];
    ASSERT_EQ(static_cast<int64_t>(m.rows.size()), w.shape[0]);
    const float* sc = s->scale.as<float>();
    for (int64_t r = 0; r < w.shape[0]; ++r) {
      const auto& [sw, sr] = m.rows[static_cast<size_t>(r)];
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(w.as<uint8_t>()[r * cols + c], sw.byte(sr, c)) << r << "," << c;
        const double got = static_cast<double>(fp8_e4m3_to_f32(w.as<uint8_t>()[r * cols + c])) *
                           sc[(r / s->block_rows) * s->scale.shape[1] + c / 128];
        const double want = sw.value(sr, c);
        ASSERT_TRUE(got == want || (std::isnan(got) && std::isnan(want))) << r << "," << c;
      }
    }
  }
  // lm_head and the embedding stay BF16; --verify covers the scale tensors.
  EXPECT_EQ(pack->tensor("lm_head").dtype, DType::BF16);
  EXPECT_EQ(pack->tensor("embed_tokens").dtype, DType::BF16);
  EXPECT_EQ(pack->verify(), pack->tensors().size() + 1);  // + generation_config.json
}

// Round d (exact) to a float with p significant bits and exponents down to
// emin (the subnormal quantum 2^emin), to nearest, ties to even.
double round_to_bits(double d, int p, int emin) {
  if (d == 0 || std::isnan(d)) return d;
  int e;
  std::frexp(d, &e);  // |d| in [2^(e-1), 2^e)
  const int q = std::max(e - p, emin);
  return std::ldexp(std::nearbyint(std::ldexp(d, -q)), q);
}

class Fp8Dequantize : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8Dequantize, EachWeightIsTheExactProductRoundedOnce) {
  const std::string dtype = GetParam();
  TempDir tmp;
  const auto pack = convert_to(tmp, dtype);
  const Fp8Source src;
  EXPECT_TRUE(pack->fp8_tensors().empty());
  EXPECT_FALSE(pack->manifest().contains("quantization"));
  EXPECT_TRUE(pack->has_transform("dequantize_fp8"));
  int64_t inexact_f32 = 0;
  for (const std::string& name : fp8_pack_matrices()) {
    SCOPED_TRACE(name);
    const TensorView& w = pack->tensor(name);
    const RowMap m = row_map(src, name);
    const int64_t cols = w.shape[1];
    for (int64_t r = 0; r < w.shape[0]; ++r) {
      const auto& [sw, sr] = m.rows[static_cast<size_t>(r)];
      for (int64_t c = 0; c < cols; ++c) {
        const double exact = sw.value(sr, c);
        const int64_t i = r * cols + c;
        double got, want;
        if (dtype == "f32") {
          got = w.as<float>()[i];
          want = round_to_bits(exact, 24, -149);
          // the kernels' float32 product is the same number
          ASSERT_EQ(static_cast<float>(got), fp8_e4m3_to_f32(sw.byte(sr, c)) * sw.scale(sr, c));
          inexact_f32 += got != exact;
        } else if (dtype == "bf16") {
          got = bf16_to_f32(w.as<uint16_t>()[i]);
          want = round_to_bits(exact, 8, -133);
        } else {
          got = f16_to_f32(w.as<uint16_t>()[i]);
          want = round_to_bits(exact, 11, -24);
        }
        ASSERT_EQ(got, want) << r << "," << c << " exact " << exact;
      }
    }
  }
  // note: the float32 product is not always exact (up to 28 significant
  // bits); the fixture's 24-bit scales make many products inexact.
  if (dtype == "f32") {
    EXPECT_GT(inexact_f32, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Fp8Dequantize, ::testing::Values("f32", "bf16", "f16"));

TEST(Fp8Convert, RoundToOddIsInnocuousForDoubleRounding) {
  // A product just above a bf16 halfway point but within half a float32 ulp
  // of it: rounding to float32 first (nearest) would land on the halfway
  // point and then tie to even (down); one rounding goes up.
  const double halfway = 1.0 + std::ldexp(1.0, -8);  // between bf16 1.0 and 1.0078125
  const double d = halfway + std::ldexp(1.0, -30);
  EXPECT_EQ(static_cast<float>(d), static_cast<float>(halfway));     // nearest f32 loses the excess
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(static_cast<float>(d))), 1.0f);  // double rounding: wrong
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(round_to_odd_f32(d))), 1.0078125f);  // one rounding
  EXPECT_EQ(round_to_odd_f32(1.5), 1.5f);
  EXPECT_EQ(round_to_odd_f32(-d), -round_to_odd_f32(d));
}

}  // namespace
}  // namespace qtk

namespace qtk {
namespace {

// first_non_finite (core/dtype.h), the scan behind convert's and the pack
// verify's refusal of NaN and infinite values, against a one-element-at-a-time
// reference: random data of awkward lengths and offsets, with and without one
// non-finite element placed at a random index (for F8_E4M3 the e4m3fn NaN
// bytes 0x7f and 0xff; their neighbours 0x7e, 0xfe, 0x80 are finite).
TEST(FirstNonFinite, MatchesTheElementByElementReference) {
  std::mt19937 rng(5);
  auto reference = [](const uint8_t* p, DType t, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      float f = 0;
      if (t == DType::F8_E4M3) {
        if ((p[i] & 0x7f) == 0x7f) return i;
        continue;
      }
      if (t == DType::F32) std::memcpy(&f, p + 4 * i, 4);
      uint16_t h;
      if (t == DType::BF16) {
        std::memcpy(&h, p + 2 * i, 2);
        const uint32_t u = static_cast<uint32_t>(h) << 16;
        std::memcpy(&f, &u, 4);
      }
      if (t == DType::F16) {
        std::memcpy(&h, p + 2 * i, 2);
        if ((h & 0x7c00) == 0x7c00) return i;
        continue;
      }
      if (!std::isfinite(f)) return i;
    }
    return n;
  };
  for (const DType t : {DType::F8_E4M3, DType::BF16, DType::F16, DType::F32}) {
    const size_t w = dtype_size(t);
    for (const size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63},
                           size_t{1000}, size_t{4097}}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<uint8_t> buf(n * w + 3);
        const size_t off = trial % 3;  // unaligned starts too
        uint8_t* p = buf.data() + off;
        for (size_t i = 0; i < n * w; ++i) p[i] = static_cast<uint8_t>(rng());
        // finite everywhere first: clear whatever random bits made non-finite
        for (size_t i = 0; i < n; ++i)
          while (reference(p + i * w, t, 1) == 0) p[i * w + w - 1] ^= 0x40;
        if (t == DType::F8_E4M3 && n > 0)
          p[rng() % n] = std::array<uint8_t, 3>{0x7e, 0xfe, 0x80}[trial % 3];
        ASSERT_EQ(first_non_finite(p, t, n), n) << dtype_name(t) << " n " << n;
        if (n == 0) continue;
        const size_t at = rng() % n;
        if (t == DType::F8_E4M3) {
          p[at] = trial % 2 ? 0x7f : 0xff;
        } else if (t == DType::F32) {
          const float v = trial % 2 ? std::nanf("") : -INFINITY;
          std::memcpy(p + at * w, &v, 4);
        } else {
          const uint16_t v = t == DType::BF16 ? 0x7fc0 : 0xfc00;
          std::memcpy(p + at * w, &v, 2);
        }
        EXPECT_EQ(first_non_finite(p, t, n), reference(p, t, n)) << dtype_name(t) << " n " << n;
        EXPECT_EQ(first_non_finite(p, t, n), at) << dtype_name(t) << " n " << n;
      }
    }
  }
}

}  // namespace
}  // namespace qtk
