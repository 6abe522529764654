#include "loaders/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/json.h"
#include "loaders/name_table.h"
#include "tests/loaders/test_util.h"

namespace qtk {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_of;
using testing::source_path;
using testing::TempDir;

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "expected '" << part << "' in: " << msg;
}

std::vector<int64_t> shape_of(const TensorView& v) { return {v.shape, v.shape + v.ndim}; }

// --- real checkpoints -----------------------------------------------------------

// Every tensor of every weight file is either a checkpoint tensor, in a
// skipped group, or (tied only) the redundant lm_head; views are the file's bytes.
void check_accounts_for_every_file_tensor(const Checkpoint& ck) {
  size_t in_files = 0;
  for (const auto& [name, file] : ck.shards()) {
    for (const auto& t : file->tensors()) {
      ++in_files;
      const HfName m = map_hf_name(t.name);
      if (m.kind != HfName::Kind::kModel) continue;
      const CheckpointTensor* c = ck.find(m.canonical);
      if (!c) {
        EXPECT_TRUE(m.canonical == "lm_head.weight" && ck.config().tie_word_embeddings) << t.name;
        continue;
      }
      EXPECT_EQ(c->hf_name, t.name);
      EXPECT_EQ(c->file, name);
      EXPECT_EQ(c->view.data, t.view.data);  // zero-copy: the same bytes of the mapping
    }
  }
  size_t skipped = 0;
  for (const auto& g : ck.skipped_groups()) skipped += static_cast<size_t>(g.count);
  EXPECT_EQ(in_files, ck.tensors().size() + skipped);
}

TEST(Checkpoint, Qwen3TinyTied) {
  auto ck = Checkpoint::open(source_path("tests/data/models/qwen3-tiny"));
  // 3 layers x (2 norms + q,k,v,o,q_norm,k_norm + 3 mlp) + embed + norm; tied: no lm_head.
  EXPECT_EQ(ck->tensors().size(), 3u * 11 + 2);
  EXPECT_EQ(ck->tensors().front().name, "embed_tokens.weight");
  EXPECT_EQ(ck->tensors().back().name, "norm.weight");
  EXPECT_EQ(ck->find("lm_head.weight"), nullptr);
  EXPECT_EQ(shape_of(ck->find("layers.0.self_attn.q_proj.weight")->view),
            (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(shape_of(ck->find("layers.2.self_attn.o_proj.weight")->view),
            (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(shape_of(ck->find("layers.1.self_attn.k_norm.weight")->view),
            (std::vector<int64_t>{32}));
  EXPECT_EQ(ck->find("layers.0.mlp.up_proj.weight")->view.dtype, DType::BF16);
  EXPECT_TRUE(ck->skipped_groups().empty());
  EXPECT_TRUE(ck->generation() != nullptr);
  EXPECT_EQ(ck->source_files().size(), 3u);  // config, generation_config, model.safetensors
  check_accounts_for_every_file_tensor(*ck);
}

TEST(Checkpoint, Qwen3ShardedUntied) {
  auto ck = Checkpoint::open(source_path("tests/data/models/qwen3-tiny-sharded-f32/"));
  EXPECT_EQ(ck->shards().size(), 5u);
  EXPECT_EQ(ck->tensors().size(), 47u);  // the index lists 47 tensors
  EXPECT_EQ(ck->tensors().back().name, "lm_head.weight");
  EXPECT_EQ(ck->find("lm_head.weight")->file, "model-00005-of-00005.safetensors");
  EXPECT_EQ(ck->find("embed_tokens.weight")->file, "model-00001-of-00005.safetensors");
  EXPECT_EQ(shape_of(ck->find("layers.3.self_attn.k_proj.weight")->view),
            (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(ck->find("lm_head.weight")->view.dtype, DType::F32);
  EXPECT_EQ(ck->source_files().size(), 2u + 1 + 5);  // config, gen config, index, 5 shards
  EXPECT_EQ(ck->dir(), source_path("tests/data/models/qwen3-tiny-sharded-f32"));
  check_accounts_for_every_file_tensor(*ck);
}

TEST(Checkpoint, Qwen35TinyHybrid) {
  auto ck = Checkpoint::open(source_path("tests/data/models/qwen3.5-tiny"));
  EXPECT_EQ(ck->config().plan_string(), "LLLFLLLF");
  // 6 linear layers x (2 norms + 9 GDN + 3 mlp) + 2 full x 11 + embed + norm.
  EXPECT_EQ(ck->tensors().size(), 6u * 14 + 2 * 11 + 2);
  EXPECT_EQ(shape_of(ck->find("layers.3.self_attn.q_proj.weight")->view),
            (std::vector<int64_t>{256, 64}));  // [2 * 4 heads * 32, hidden]: output gate
  EXPECT_EQ(shape_of(ck->find("layers.0.linear_attn.conv1d.weight")->view),
            (std::vector<int64_t>{128, 1, 4}));
  EXPECT_EQ(shape_of(ck->find("layers.0.linear_attn.A_log")->view), (std::vector<int64_t>{4}));
  EXPECT_EQ(ck->find("layers.3.linear_attn.A_log"), nullptr);        // full layer
  EXPECT_EQ(ck->find("layers.0.self_attn.q_proj.weight"), nullptr);  // linear layer
  check_accounts_for_every_file_tensor(*ck);
}

TEST(Checkpoint, Qwen35VlmMultimodalLayout) {
  auto ck = Checkpoint::open(source_path("tests/data/models/qwen3.5-tiny-vlm"));
  const ModelConfig& c = ck->config();
  EXPECT_EQ(c.plan_string(), "LFLLFL");
  EXPECT_EQ(ck->tensors().size(), 4u * 14 + 2 * 11 + 3);  // + embed, norm, lm_head
  const auto* qkv = ck->find("layers.0.linear_attn.in_proj_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->hf_name, "model.language_model.layers.0.linear_attn.in_proj_qkv.weight");
  EXPECT_EQ(shape_of(qkv->view), (std::vector<int64_t>{2 * 2 * 32 + 2 * 24, 64}));
  EXPECT_EQ(shape_of(ck->find("layers.5.linear_attn.out_proj.weight")->view),
            (std::vector<int64_t>{64, 48}));
  EXPECT_EQ(shape_of(ck->find("layers.2.linear_attn.norm.weight")->view),
            (std::vector<int64_t>{24}));
  EXPECT_EQ(shape_of(ck->find("layers.2.linear_attn.in_proj_z.weight")->view),
            (std::vector<int64_t>{48, 64}));
  EXPECT_EQ(shape_of(ck->find("layers.2.linear_attn.in_proj_b.weight")->view),
            (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(ck->tensors().back().name, "lm_head.weight");
  // From the shard listings: 21 vision tensors (1 block of 12, merger 6,
  // patch embed 2, pos embed 1) and 5 MTP tensors.
  ASSERT_EQ(ck->skipped_groups().size(), 2u);
  EXPECT_EQ(ck->skipped_groups()[0].prefix, "model.visual");
  EXPECT_EQ(ck->skipped_groups()[0].count, 21);
  EXPECT_EQ(ck->skipped_groups()[1].prefix, "mtp");
  EXPECT_EQ(ck->skipped_groups()[1].count, 5);
  EXPECT_EQ(ck->skipped_groups()[1].bytes, 16384 + 16384 + 128 * 3);  // fc, gate_proj, 3 norms
  check_accounts_for_every_file_tensor(*ck);
}

TEST(Checkpoint, SamplesAndEosFromGenerationConfig) {
  for (const char* rel : {"samples/qwen3-sample", "samples/qwen3.5-sample"}) {
    SCOPED_TRACE(rel);
    auto ck = Checkpoint::open(source_path(rel));
    EXPECT_EQ(ck->config().eos_token_ids, std::vector<int64_t>{0});
    EXPECT_TRUE(ck->has_file("tokenizer.json"));
    EXPECT_FALSE(ck->has_file("no-such-file"));
    EXPECT_EQ(shape_of(ck->find("embed_tokens.weight")->view), (std::vector<int64_t>{4096, 256}));
    check_accounts_for_every_file_tensor(*ck);
  }
}

TEST(Checkpoint, ViewBytesAreTheFileBytes) {
  const std::string dir = source_path("tests/data/models/qwen3-tiny-sharded-f32");
  auto ck = Checkpoint::open(dir);
  const CheckpointTensor* t = ck->find("layers.1.mlp.down_proj.weight");
  ASSERT_NE(t, nullptr);
  const auto* st = ck->shards().at(t->file)->find(t->hf_name);
  const std::string bytes = testing::read_file(dir + "/" + t->file);
  ASSERT_LE(st->file_offset + static_cast<uint64_t>(t->view.nbytes()), bytes.size());
  EXPECT_EQ(std::memcmp(t->view.data, bytes.data() + st->file_offset,
                        static_cast<size_t>(t->view.nbytes())),
            0);
}

// --- crafted checkpoints ------------------------------------------------------------

struct RawTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::vector<RawTensor> read_tensors(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  std::vector<RawTensor> out;
  for (const auto& t : f->tensors())
    out.push_back(
        {t.name, t.view.dtype, shape_of(t.view),
         std::string(static_cast<const char*>(t.view.data), static_cast<size_t>(t.view.nbytes()))});
  return out;
}

void write_tensors(const std::string& path, const std::vector<RawTensor>& ts) {
  json h = json::object();
  std::string data;
  for (const auto& t : ts) {
    h[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                 {"shape", t.shape},
                 {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string header = h.dump();
  while (header.size() % 8) header += ' ';
  testing::write_file(path, testing::safetensors_bytes(header, 0) + data);
}

RawTensor zeros(const std::string& name, DType dt, std::vector<int64_t> shape) {
  int64_t n = dtype_size(dt);
  for (int64_t d : shape) n *= d;
  return {name, dt, std::move(shape), std::string(static_cast<size_t>(n), '\0')};
}

// A writable copy of a fixture directory.
std::string copy_fixture(const TempDir& tmp, const std::string& rel) {
  const fs::path dst = tmp.path() / "ck";
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(source_path(rel))) {
    fs::copy_file(e.path(), dst / e.path().filename());
    fs::permissions(dst / e.path().filename(), fs::perms::owner_write, fs::perm_options::add);
  }
  return dst.string();
}

class Crafted : public ::testing::Test {
 protected:
  TempDir tmp;
  std::string dir;
  std::string open_error() {
    return error_of([&] { Checkpoint::open(dir); });
  }
  // Rewrites `file` in dir with `edit` applied to its tensors.
  void edit_file(const std::string& file,
                 const std::function<void(std::vector<RawTensor>&)>& edit) {
    auto ts = read_tensors(dir + "/" + file);
    edit(ts);
    write_tensors(dir + "/" + file, ts);
  }
  void edit_index(const std::function<void(json&)>& edit) {
    const std::string p = dir + "/model.safetensors.index.json";
    json j = load_json_file(p);
    edit(j);
    testing::write_file(p, j.dump(2));
  }
  static void erase(std::vector<RawTensor>& ts, const std::string& name) {
    std::erase_if(ts, [&](const RawTensor& t) { return t.name == name; });
  }
};

class CraftedSingle : public Crafted {
 protected:
  void SetUp() override { dir = copy_fixture(tmp, "tests/data/models/qwen3-tiny"); }
};
class CraftedSharded : public Crafted {
 protected:
  void SetUp() override { dir = copy_fixture(tmp, "tests/data/models/qwen3-tiny-sharded-f32"); }
  static constexpr const char* kShard1 = "model-00001-of-00005.safetensors";
  static constexpr const char* kShard5 = "model-00005-of-00005.safetensors";
};

TEST_F(CraftedSingle, CopyLoads) { EXPECT_NO_THROW(Checkpoint::open(dir)); }

TEST_F(CraftedSingle, MissingConfig) {
  fs::remove(dir + "/config.json");
  expect_has(open_error(), dir + ": missing config.json");
}

TEST_F(CraftedSingle, NoWeights) {
  fs::remove(dir + "/model.safetensors");
  expect_has(open_error(),
             "no weights: expected model.safetensors or model.safetensors.index.json");
}

TEST_F(CraftedSingle, NotADirectory) {
  dir += "/config.json";
  expect_has(open_error(), "expected a checkpoint directory, found a file");
}

TEST_F(CraftedSingle, BothSingleAndIndex) {
  testing::write_file(dir + "/model.safetensors.index.json", R"({"weight_map":{}})");
  expect_has(open_error(), "both model.safetensors and model.safetensors.index.json exist");
}

TEST_F(CraftedSingle, MalformedWeightsFileNamesIt) {
  testing::write_file(dir + "/model.safetensors", "short");
  expect_has(open_error(), dir + "/model.safetensors: expected at least 8 bytes");
}

TEST_F(CraftedSingle, MissingTensor) {
  edit_file("model.safetensors",
            [](auto& ts) { erase(ts, "model.layers.1.post_attention_layernorm.weight"); });
  expect_has(open_error(),
             "missing tensor \"layers.1.post_attention_layernorm.weight\" (expected shape [64] for "
             "Qwen3ForCausalLM)");
}

TEST_F(CraftedSingle, WrongShape) {
  edit_file("model.safetensors", [](auto& ts) {
    erase(ts, "model.layers.0.self_attn.q_proj.weight");
    ts.push_back(zeros("model.layers.0.self_attn.q_proj.weight", DType::BF16, {64, 64}));
  });
  expect_has(open_error(),
             "model.safetensors: tensor \"model.layers.0.self_attn.q_proj.weight\": expected shape "
             "[128, 64] from the config, found [64, 64]");
}

TEST_F(CraftedSingle, UnsupportedDType) {
  edit_file("model.safetensors", [](auto& ts) {
    erase(ts, "model.norm.weight");
    ts.push_back(zeros("model.norm.weight", DType::I16, {64}));
  });
  expect_has(open_error(),
             "tensor \"model.norm.weight\": dtype I16 is not supported (expected BF16, F16, F32 "
             "or F8_E4M3)");
}

TEST_F(CraftedSingle, Fp8WithoutQuantizationConfig) {
  edit_file("model.safetensors", [](auto& ts) {
    erase(ts, "model.norm.weight");
    ts.push_back(zeros("model.norm.weight", DType::F8_E4M3, {64}));
  });
  expect_has(open_error(), "tensor \"model.norm.weight\": dtype F8_E4M3, but " + dir +
                               "/config.json has no quantization_config");
}

// The FP8 fixture: every F8_E4M3 weight has its scales attached, every other
// tensor has none, and the config's block size is read.
TEST(Checkpoint, Qwen3Fp8TinyScalesPaired) {
  auto ck = Checkpoint::open(source_path("tests/data/models/qwen3-fp8-tiny"));
  const Fp8Quantization& q = ck->config().fp8;
  EXPECT_TRUE(q.enabled);
  EXPECT_EQ(q.block_rows, 128);
  EXPECT_EQ(q.block_cols, 128);
  EXPECT_EQ(q.modules_to_not_convert, std::vector<std::string>{"lm_head"});
  int fp8 = 0;
  for (const CheckpointTensor& t : ck->tensors()) {
    if (t.view.dtype != DType::F8_E4M3) {
      EXPECT_EQ(t.scale.data, nullptr) << t.hf_name;
      continue;
    }
    ++fp8;
    ASSERT_NE(t.scale.data, nullptr) << t.hf_name;
    EXPECT_EQ(t.scale_hf_name, t.hf_name + "_scale_inv");
    EXPECT_EQ(t.scale.dtype, DType::F32);
    EXPECT_EQ(shape_of(t.scale),
              (std::vector<int64_t>{(t.view.shape[0] + 127) / 128, (t.view.shape[1] + 127) / 128}));
  }
  EXPECT_EQ(fp8, 2 * 7);  // q, k, v, o, gate, up, down per layer
  EXPECT_EQ(ck->find("lm_head.weight")->view.dtype, DType::BF16);
  EXPECT_EQ(ck->find("layers.0.mlp.down_proj.weight")->scale.shape[1], 3);  // 320 cols: partial
}

// A checkpoint whose modules_to_not_convert names FP8 tensors contradicts
// itself: they are read as FP8 (the dtype decides), and a config line says so.
TEST(Checkpoint, Fp8TensorsNamedByModulesToNotConvertAreNoted) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "tests/data/models/qwen3-fp8-tiny");
  auto notes = [&] {
    std::string out;
    const auto ck = Checkpoint::open(dir);
    for (const std::string& r : ck->config().resolution)
      if (r.find("modules_to_not_convert") != std::string::npos) out += r + "\n";
    return out;
  };
  EXPECT_EQ(notes(), "");  // the fixture's own list: lm_head, which is bf16
  json c = load_json_file(dir + "/config.json");
  c["quantization_config"]["modules_to_not_convert"] = {"lm_head", "self_attn.k_proj"};
  testing::write_file(dir + "/config.json", c.dump(2));
  EXPECT_EQ(notes(),
            "quantization_config.modules_to_not_convert names 'self_attn.k_proj', yet 2 F8_E4M3 "
            "tensors under it (first: model.layers.0.self_attn.k_proj.weight) have block scales: "
            "read as FP8 (a weight's dtype decides)\n");
}

TEST_F(CraftedSingle, UnknownTensorName) {
  edit_file("model.safetensors",
            [](auto& ts) { ts.push_back(zeros("encoder.weight", DType::BF16, {2})); });
  expect_has(open_error(), "tensor \"encoder.weight\": unknown tensor name");
}

TEST_F(CraftedSingle, ExtraTensorInsideALayer) {
  edit_file("model.safetensors", [](auto& ts) {
    ts.push_back(zeros("model.layers.2.self_attn.q_proj.bias", DType::BF16, {128}));
  });
  expect_has(open_error(),
             "tensor \"model.layers.2.self_attn.q_proj.bias\": unexpected tensor (canonical "
             "\"layers.2.self_attn.q_proj.bias\") for Qwen3ForCausalLM with layer plan FFF");
}

TEST_F(CraftedSingle, ExtraLayer) {
  edit_file("model.safetensors", [](auto& ts) {
    ts.push_back(zeros("model.layers.3.input_layernorm.weight", DType::BF16, {64}));
  });
  expect_has(open_error(), "unexpected tensor (canonical \"layers.3.input_layernorm.weight\")");
}

TEST_F(CraftedSingle, MixedNameLayouts) {
  edit_file("model.safetensors", [](auto& ts) {
    ts.push_back(zeros("model.language_model.norm.weight", DType::BF16, {64}));
  });
  expect_has(open_error(), "both map to \"norm.weight\"");
}

TEST_F(CraftedSingle, TiedWithLmHeadPresentIsAcceptedAndIgnored) {
  edit_file("model.safetensors", [](auto& ts) {
    ts.push_back(zeros("lm_head.weight", DType::BF16, {512, 64}));
  });
  auto ck = Checkpoint::open(dir);
  EXPECT_EQ(ck->find("lm_head.weight"), nullptr);
  ASSERT_EQ(ck->skipped_groups().size(), 1u);
  EXPECT_EQ(ck->skipped_groups()[0].prefix, "lm_head (tied)");
  EXPECT_EQ(ck->skipped_groups()[0].bytes, 512 * 64 * 2);
}

TEST_F(CraftedSingle, SkippedGroupsAreCounted) {
  edit_file("model.safetensors", [](auto& ts) {
    ts.push_back(zeros("model.visual.blocks.0.norm1.weight", DType::BF16, {8}));
    ts.push_back(zeros("mtp.fc.weight", DType::BF16, {4, 4}));
    ts.push_back(zeros("model.mtp.norm.weight", DType::F32, {4}));
    ts.push_back(zeros("mtp.norm.weight", DType::BF16, {4}));
  });
  auto ck = Checkpoint::open(dir);
  ASSERT_EQ(ck->skipped_groups().size(), 3u);
  EXPECT_EQ(ck->skipped_groups()[0].prefix, "model.visual");
  EXPECT_EQ(ck->skipped_groups()[0].bytes, 16);
  EXPECT_EQ(ck->skipped_groups()[1].prefix, "mtp");
  EXPECT_EQ(ck->skipped_groups()[1].count, 2);
  EXPECT_EQ(ck->skipped_groups()[2].prefix, "model.mtp");
  EXPECT_EQ(ck->skipped_groups()[2].bytes, 16);
}

TEST_F(CraftedSingle, EosFromGenerationConfigElseConfig) {
  json cfg = load_json_file(dir + "/config.json");
  cfg["eos_token_id"] = 3;
  testing::write_file(dir + "/config.json", cfg.dump());
  EXPECT_EQ(Checkpoint::open(dir)->config().eos_token_ids,
            std::vector<int64_t>{3});  // gen config has none
  testing::write_file(dir + "/generation_config.json",
                      R"({"eos_token_id":[5,6],"max_new_tokens":32})");
  auto ck = Checkpoint::open(dir);
  EXPECT_EQ(ck->config().eos_token_ids, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(ck->generation()->max_new_tokens, 32);
  testing::write_file(dir + "/generation_config.json", R"({"eos_token_id":600})");
  expect_has(
      open_error(),
      "generation_config.json: field 'eos_token_id': expected ids below vocab_size 512, found 600");
  fs::remove(dir + "/generation_config.json");
  EXPECT_EQ(Checkpoint::open(dir)->generation(), nullptr);
}

TEST_F(CraftedSharded, CopyLoads) { EXPECT_NO_THROW(Checkpoint::open(dir)); }

TEST_F(CraftedSharded, MissingLmHeadWhenUntied) {
  edit_file(kShard5, [](auto& ts) { erase(ts, "lm_head.weight"); });
  edit_index([](json& j) { j["weight_map"].erase("lm_head.weight"); });
  expect_has(open_error(),
             "missing tensor lm_head.weight (tie_word_embeddings is false, so it is required)");
}

TEST_F(CraftedSharded, ShardNamesMustBePlainFileNames) {
  for (const char* bad :
       {"../model-00005-of-00005.safetensors", "/etc/passwd", "sub/x.safetensors", "..", "."}) {
    SCOPED_TRACE(bad);
    edit_index([&](json& j) { j["weight_map"]["lm_head.weight"] = bad; });
    expect_has(open_error(),
               "field 'weight_map': tensor \"lm_head.weight\": expected a plain file name inside "
               "the directory");
  }
}

TEST_F(CraftedSharded, MissingShardFile) {
  fs::remove(dir + "/" + kShard5);
  expect_has(open_error(), "shard \"model-00005-of-00005.safetensors\" does not exist");
}

TEST_F(CraftedSharded, IndexedTensorNotInItsShard) {
  edit_index(
      [](json& j) { j["weight_map"]["lm_head.weight"] = "model-00001-of-00005.safetensors"; });
  expect_has(open_error(),
             "tensor \"lm_head.weight\" is indexed to model-00001-of-00005.safetensors but that "
             "shard does not contain it");
}

TEST_F(CraftedSharded, UnindexedTensorInAShard) {
  edit_file(kShard1,
            [](auto& ts) { ts.push_back(zeros("model.layers.0.extra", DType::F32, {2})); });
  expect_has(open_error(),
             "tensor \"model.layers.0.extra\" is not listed in model.safetensors.index.json "
             "(unindexed tensor)");
}

TEST_F(CraftedSharded, TensorInTwoShards) {
  edit_file(kShard1, [](auto& ts) {
    ts.push_back(zeros("lm_head.weight", DType::F32, {600, 64}));
  });
  expect_has(open_error(),
             "tensor \"lm_head.weight\" is in two shards: model-00001-of-00005.safetensors and "
             "model-00005-of-00005.safetensors");
}

TEST_F(CraftedSharded, IndexWithoutWeightMap) {
  testing::write_file(dir + "/model.safetensors.index.json", R"({"metadata":{}})");
  expect_has(open_error(), "model.safetensors.index.json: field 'weight_map': expected an object");
}

TEST_F(CraftedSharded, IndexWithDuplicateKey) {
  testing::write_file(dir + "/model.safetensors.index.json",
                      R"({"weight_map":{"lm_head.weight":"a","lm_head.weight":"b"}})");
  expect_has(open_error(), "duplicate JSON key 'lm_head.weight' in object /weight_map");
}

TEST(NameTable, MapsBothLayoutsAndSkipsGroups) {
  EXPECT_EQ(map_hf_name("model.layers.3.mlp.up_proj.weight").canonical,
            "layers.3.mlp.up_proj.weight");
  EXPECT_EQ(map_hf_name("model.language_model.embed_tokens.weight").canonical,
            "embed_tokens.weight");
  EXPECT_EQ(map_hf_name("lm_head.weight").canonical, "lm_head.weight");
  EXPECT_EQ(map_hf_name("model.visual.merger.norm.weight").kind, HfName::Kind::kSkipped);
  EXPECT_EQ(map_hf_name("model.visual.merger.norm.weight").group, "model.visual");
  EXPECT_EQ(map_hf_name("mtp.fc.weight").group, "mtp");
  EXPECT_EQ(map_hf_name("model.mtp.fc.weight").group, "model.mtp");
  EXPECT_EQ(map_hf_name("lm_head.bias").kind, HfName::Kind::kUnknown);
  EXPECT_EQ(map_hf_name("transformer.h.0.attn").kind, HfName::Kind::kUnknown);
  EXPECT_EQ(map_hf_name("model.").kind, HfName::Kind::kUnknown);
  EXPECT_EQ(map_hf_name("model.visualx.w").kind,
            HfName::Kind::kModel);  // not the group; rejected later
}

TEST(GenerationConfig, Fields) {
  const GenerationConfig g = parse_generation_config(
      json::parse(
          R"({"eos_token_id":[1,2],"bos_token_id":3,"pad_token_id":null,"max_new_tokens":7,"max_length":99})"),
      "g.json");
  EXPECT_TRUE(g.has_eos);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(g.bos_token_id, 3);
  EXPECT_EQ(g.pad_token_id, -1);
  EXPECT_EQ(g.max_new_tokens, 7);
  EXPECT_EQ(g.max_length, 99);
  EXPECT_FALSE(parse_generation_config(json::parse(R"({"eos_token_id":null})"), "g.json").has_eos);
  expect_has(
      error_of([] { parse_generation_config(json::parse(R"({"max_new_tokens":-1})"), "g.json"); }),
      "g.json: field 'max_new_tokens': expected a positive integer, found -1");
  expect_has(
      error_of([] { parse_generation_config(json::parse(R"({"eos_token_id":"x"})"), "g.json"); }),
      "g.json: field 'eos_token_id': expected a token id");
}

}  // namespace
}  // namespace qtk
