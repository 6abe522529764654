// Bad shard indexes, configs and tensor sets handed to the real `convert`.
#include <sys/stat.h>
#include <sys/types.h>

#include <filesystem>
#include <string>

#include "tests/badinput/checkpoint_fixture.h"

namespace qtk::testing {
namespace {

using nlohmann::ordered_json;

const char* const kSharded = "qwen3-tiny-sharded-f32";
const char* const kIndex = "model.safetensors.index.json";

auto edit_index(std::function<void(ordered_json& weight_map)> edit) {
  return [edit](const std::string& ckpt) {
    edit_json(ckpt + "/" + kIndex, [&](ordered_json& j) { edit(j["weight_map"]); });
  };
}

std::string first_key(const ordered_json& m) { return m.begin().key(); }

TEST(BadIndex, ShardOutsideTheDirectory) {
  for (const std::string prefix : {"../", "/tmp/", "sub/", "..\\"}) {
    SCOPED_TRACE(prefix);
    expect_convert_rejects(kSharded, edit_index([&](ordered_json& m) {
                             auto& v = m[first_key(m)];
                             v = prefix + v.get<std::string>();
                           }),
                           {kIndex, "plain file name"});
  }
  expect_convert_rejects(kSharded, edit_index([](ordered_json& m) { m[first_key(m)] = ".."; }),
                         {kIndex, "plain file name"});
}

TEST(BadIndex, MissingShard) {
  expect_convert_rejects(kSharded, edit_index([](ordered_json& m) {
                           m[first_key(m)] = "model-00009-of-00005.safetensors";
                         }),
                         {kIndex, "model-00009-of-00005.safetensors"});
  // The index names a shard that is a directory, not a file.
  expect_convert_rejects(kSharded,
                         [](const std::string& ckpt) {
                           std::filesystem::create_directory(ckpt + "/dir.safetensors");
                           edit_json(ckpt + "/" + kIndex, [](ordered_json& j) {
                             j["weight_map"][first_key(j["weight_map"])] = "dir.safetensors";
                           });
                         },
                         {"dir.safetensors"});
}

TEST(BadIndex, TensorListedTwice) {
  // Two keys with the same tensor name (nlohmann would keep the last one).
  expect_convert_rejects(
      kSharded,
      [](const std::string& ckpt) {
        std::string text = read_file(ckpt + "/" + kIndex);
        const auto j = ordered_json::parse(text);
        const std::string name = first_key(j["weight_map"]);
        const size_t pos = text.find("\"weight_map\": {") + std::string("\"weight_map\": {").size();
        ASSERT_NE(pos, std::string::npos);
        text.insert(pos, "\n    \"" + name + "\": \"model-00002-of-00005.safetensors\",");
        write_file(ckpt + "/" + kIndex, text);
      },
      {kIndex, "duplicate"});
}

TEST(BadIndex, TensorInTheWrongShardOrUnindexed) {
  // Indexed to a shard that does not hold it.
  expect_convert_rejects(kSharded, edit_index([](ordered_json& m) {
                           for (auto& [k, v] : m.items()) {
                             if (v != "model-00005-of-00005.safetensors") {
                               v = "model-00005-of-00005.safetensors";
                               return;
                             }
                           }
                         }),
                         {kIndex, "does not contain"});
  // A shard tensor missing from the index.
  expect_convert_rejects(kSharded, edit_index([](ordered_json& m) { m.erase(first_key(m)); }),
                         {"not listed"});
}

TEST(BadIndex, MalformedIndex) {
  expect_convert_rejects(kSharded,
                         [](const std::string& ckpt) { write_file(ckpt + "/" + kIndex, "[]"); },
                         {kIndex, "object"});
  expect_convert_rejects(kSharded, edit_index([](ordered_json& m) { m = ordered_json::object(); }),
                         {kIndex, "weight_map"});
  expect_convert_rejects(kSharded, edit_index([](ordered_json& m) { m[first_key(m)] = 5; }),
                         {kIndex, "weight_map"});
  expect_convert_rejects(
      kSharded,
      [](const std::string& ckpt) { write_file(ckpt + "/" + kIndex, "{\"weight_map\": {"); },
      {kIndex});
}

// ---- config.json -----------------------------------------------------------

auto edit_config(std::function<void(ordered_json&)> edit) {
  return [edit](const std::string& ckpt) { edit_json(ckpt + "/config.json", edit); };
}

TEST(BadConfig, MissingFields) {
  for (const char* field : {"hidden_size", "num_attention_heads", "vocab_size", "architectures"}) {
    SCOPED_TRACE(field);
    expect_convert_rejects("qwen3-tiny", edit_config([&](ordered_json& c) { c.erase(field); }),
                           {"config.json", field});
  }
}

TEST(BadConfig, WrongTypes) {
  expect_convert_rejects("qwen3-tiny",
                         edit_config([](ordered_json& c) { c["hidden_size"] = "64"; }),
                         {"config.json", "hidden_size"});
  expect_convert_rejects("qwen3-tiny",
                         edit_config([](ordered_json& c) { c["rms_norm_eps"] = -1.0; }),
                         {"config.json", "rms_norm_eps"});
  expect_convert_rejects("qwen3-tiny", edit_config([](ordered_json& c) { c["vocab_size"] = -512; }),
                         {"config.json", "vocab_size"});
}

TEST(BadConfig, LayerTypesLengthContradictsLayerCount) {
  expect_convert_rejects("qwen3.5-tiny",
                         edit_config([](ordered_json& c) { c["layer_types"].erase(0); }),
                         {"config.json", "layer_types"});
  expect_convert_rejects("qwen3.5-tiny", edit_config([](ordered_json& c) {
                           c["layer_types"][0] = "sliding_attention";
                         }),
                         {"config.json", "sliding_attention"});
}

TEST(BadConfig, MropeSectionNotThreeIntegers) {
  // note: sections need not sum to rotary_dim / 2 (transformers accepts that,
  // see tests/loaders/config_precedence_test.cpp); two entries it cannot use.
  expect_convert_rejects("qwen3.5-tiny", edit_config([](ordered_json& c) {
                           c["rope_parameters"]["mrope_section"] = {2, 2};
                         }),
                         {"config.json", "mrope_section"});
}

TEST(BadConfig, HeadsNotDividing) {
  expect_convert_rejects("qwen3-tiny",
                         edit_config([](ordered_json& c) { c["num_key_value_heads"] = 3; }),
                         {"config.json", "num_key_value_heads"});
  expect_convert_rejects("qwen3.5-tiny",
                         edit_config([](ordered_json& c) { c["linear_num_key_heads"] = 3; }),
                         {"config.json", "linear_num"});
}

TEST(BadConfig, NotJsonOrDeeplyNested) {
  expect_convert_rejects(
      "qwen3-tiny",
      [](const std::string& ckpt) { write_file(ckpt + "/config.json", "{\"a\": 1,}"); },
      {"config.json"});
  // note: a million nested arrays where a list of strings is expected: the
  // error message must not recurse through the value (stack overflow).
  expect_convert_rejects("qwen3-tiny",
                         [](const std::string& ckpt) {
                           auto c = ordered_json::parse(read_file(ckpt + "/config.json"));
                           std::string text = c.dump();
                           const std::string deep =
                               std::string(1'000'000, '[') + std::string(1'000'000, ']');
                           const std::string key = "\"architectures\":";
                           const size_t p = text.find(key);
                           const size_t end = text.find(']', p);
                           text.replace(p + key.size(), end + 1 - (p + key.size()), deep);
                           write_file(ckpt + "/config.json", text);
                         },
                         {"config.json"});
}

// ---- tensors against the config ----------------------------------------------

auto edit_st(const std::string& file, std::function<void(ordered_json&, std::string&)> edit) {
  return [file, edit](const std::string& ckpt) {
    SafetensorsParts p = read_safetensors(ckpt + "/" + file);
    edit(p.header, p.data);
    write_file(ckpt + "/" + file, build_safetensors(p.header, p.data));
  };
}

TEST(BadTensors, WrongShapeForTheConfig) {
  // q_proj is [4*32, 64] = [128, 64]; [64, 128] has the same bytes.
  expect_convert_rejects("qwen3-tiny",
                         edit_st("model.safetensors",
                                 [](ordered_json& h, std::string&) {
                                   h["model.layers.0.self_attn.q_proj.weight"]["shape"] = {64, 128};
                                 }),
                         {"model.layers.0.self_attn.q_proj.weight", "shape"});
}

TEST(BadTensors, IntegerDtypeForAWeight) {
  expect_convert_rejects("qwen3-tiny",
                         edit_st("model.safetensors",
                                 [](ordered_json& h, std::string&) {
                                   h["model.layers.0.self_attn.q_proj.weight"]["dtype"] = "I16";
                                 }),
                         {"model.layers.0.self_attn.q_proj.weight", "I16"});
}

TEST(BadTensors, MissingAndUnknownTensors) {
  // The config claims 4 layers; the checkpoint has 3, so layer 3 is missing.
  expect_convert_rejects("qwen3-tiny", edit_config([](ordered_json& c) {
                           c["num_hidden_layers"] = 4;
                           c["layer_types"].push_back("full_attention");
                         }),
                         {"layers.3"});
  // An extra tensor the name table does not know.
  expect_convert_rejects(
      "qwen3-tiny",
      edit_st("model.safetensors",
              [](ordered_json& h, std::string& data) {
                const uint64_t end = data.size();
                h["model.layers.0.mystery.weight"] = {
                    {"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {end, end + 4}}};
                data.append(4, '\0');
              }),
      {"model.layers.0.mystery.weight"});
}

// Issue 20 item 13: a message quoting a value with a NUL byte shows all of
// it, escaped (the old message stopped at the NUL: found "Qwen3).
TEST(BadConfig, NulInAQuotedValueIsEscapedNotCut) {
  expect_convert_rejects("qwen3-tiny", edit_config([](ordered_json& c) {
                           c["architectures"] = {std::string("Qwen3\0EvilForCausalLM", 21)};
                         }),
                         {"architectures", "Qwen3\\x00EvilForCausalLM"});
}

// Issue 20 item 11: every file carried into the pack is validated as the
// runtime reads it, and a non-regular one is refused by name (the old
// convert packed a tokenizer generate then refused, and dropped a FIFO or a
// link to a device silently).
TEST(BadCarriedFiles, TokenizerAndSideFilesAreCheckedAsTheRuntimeReadsThem) {
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  expect_convert_rejects(
      "qwen3-tiny", [&](const std::string& ckpt) { write_file(ckpt + "/tokenizer.json", deep); },
      {"tokenizer.json"});
  expect_convert_rejects("qwen3-tiny",
                         [](const std::string& ckpt) {
                           write_file(ckpt + "/tokenizer.json",
                                      "{\"model\": {\"type\": \"WordPiece\"}}");
                         },
                         {"tokenizer.json"});
  expect_convert_rejects("qwen3-tiny",
                         [](const std::string& ckpt) {
                           write_file(ckpt + "/tokenizer_config.json", "{\"a\": 1, \"a\": 2}");
                         },
                         {"tokenizer_config.json", "duplicate"});
  expect_convert_rejects("qwen3-tiny",
                         [](const std::string& ckpt) {
                           ASSERT_EQ(::mkfifo((ckpt + "/tokenizer.json").c_str(), 0644), 0);
                         },
                         {"tokenizer.json", "regular file", "FIFO"});
  expect_convert_rejects("qwen3-tiny",
                         [](const std::string& ckpt) {
                           std::filesystem::create_symlink("/dev/null", ckpt + "/tokenizer.json");
                         },
                         {"tokenizer.json", "regular file", "device"});
  // The checkpoint's own files too (they read as "missing" before).
  expect_convert_rejects("qwen3-tiny",
                         [](const std::string& ckpt) {
                           std::filesystem::remove(ckpt + "/config.json");
                           ASSERT_EQ(::mkfifo((ckpt + "/config.json").c_str(), 0644), 0);
                         },
                         {"config.json", "regular file", "FIFO"});
  expect_convert_rejects("qwen3-tiny",
                         [](const std::string& ckpt) {
                           std::filesystem::remove(ckpt + "/model.safetensors");
                           std::filesystem::create_directory(ckpt + "/model.safetensors");
                         },
                         {"model.safetensors", "regular file", "directory"});
  // Control: a valid tokenizer is carried.
  TempDir t;
  copy_checkpoint("qwen3-tiny", t / "ckpt");
  write_file(t / "ckpt/tokenizer.json",
             read_file(source_path("samples/qwen3-sample/tokenizer.json")));
  const RunResult ok = run_program({program("convert"), t / "ckpt", t / "ok.pack"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

// A chat template the runtime cannot use is refused by convert, naming the
// file and the field (it used to be carried into the pack, which `inspect
// --verify` passed and generate then failed on every "messages" line).
TEST(BadCarriedFiles, ChatTemplatesAreParsedAsTheRuntimeParsesThem) {
  const auto tokenizer_config = [](const std::string& value) {
    return [value](const std::string& ckpt) {
      write_file(ckpt + "/tokenizer_config.json", "{\"chat_template\": " + value + "}");
    };
  };
  expect_convert_rejects(
      "qwen3-tiny", tokenizer_config("5"),
      {"tokenizer_config.json", "field 'chat_template'", "expected a string", "number"});
  expect_convert_rejects(
      "qwen3-tiny", tokenizer_config("\"{% for x in %}\""),
      {"tokenizer_config.json", "field 'chat_template'", "does not", "TemplateSyntaxError"});
  expect_convert_rejects("qwen3-tiny",
                         tokenizer_config("[{\"name\": \"tool_use\", \"template\": \"{{ x }}\"}]"),
                         {"tokenizer_config.json", "field 'chat_template'", "'default'"});
  // The "default" entry of a list is parsed too.
  expect_convert_rejects("qwen3-tiny",
                         tokenizer_config("[{\"name\": \"default\", \"template\": \"{% if %}\"}]"),
                         {"tokenizer_config.json", "field 'chat_template'", "TemplateSyntaxError"});
  expect_convert_rejects("qwen3-tiny",
                         [](const std::string& ckpt) {
                           write_file(ckpt + "/chat_template.jinja", "{{ messages[0].content ");
                         },
                         {"chat_template.jinja", "TemplateSyntaxError", "line 1"});
  // Control: valid templates (a string, a named list, a .jinja file) are
  // carried.
  for (const std::string& value :
       {std::string("\"{% for m in messages %}{{ m.content }}{% endfor %}\""),
        std::string("[{\"name\": \"default\", \"template\": \"{{ bos_token }}\"}, "
                    "{\"name\": \"tool_use\", \"template\": \"x\"}]"),
        std::string("null")}) {
    SCOPED_TRACE(value);
    TempDir t;
    copy_checkpoint("qwen3-tiny", t / "ckpt");
    tokenizer_config(value)(t / "ckpt");
    write_file(t / "ckpt/chat_template.jinja", "{% for m in messages %}{{ m.role }}{% endfor %}");
    const RunResult ok = run_program({program("convert"), t / "ckpt", t / "ok.pack"});
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
  }
}

// ---- mixture of experts --------------------------------------------------------

TEST(BadMoe, ConfigContradictsTheExperts) {
  // 9 experts claimed, 8 stored: the router's shape says so first.
  expect_convert_rejects("qwen3-moe-tiny",
                         edit_config([](ordered_json& c) { c["num_local_experts"] = 9; }),
                         {"model.layers.0.mlp.gate.weight", "[9, 64]", "[8, 64]"});
  // Fused 3-D experts of another width.
  expect_convert_rejects(
      "qwen3.5-moe-tiny-vlm",
      edit_config([](ordered_json& c) { c["text_config"]["moe_intermediate_size"] = 16; }),
      {"model.language_model.layers.0.mlp.experts.gate_up_proj", "[8, 32, 64]", "[8, 64, 64]"});
  // A layer the config makes dense has experts, not a dense MLP.
  expect_convert_rejects("qwen3-moe-tiny",
                         edit_config([](ordered_json& c) { c["mlp_only_layers"] = {1}; }),
                         {"layers.1.mlp.gate_proj.weight", "missing"});
}

TEST(BadMoe, ConfigFieldsOutOfRange) {
  expect_convert_rejects("qwen3-moe-tiny",
                         edit_config([](ordered_json& c) { c["num_experts_per_tok"] = 9; }),
                         {"config.json", "num_experts_per_tok", "9"});
  expect_convert_rejects("qwen3-moe-tiny",
                         edit_config([](ordered_json& c) { c["num_experts"] = 4; }),
                         {"config.json", "num_experts", "num_local_experts", "disagree"});
  expect_convert_rejects("qwen3.5-moe-tiny-vlm", edit_config([](ordered_json& c) {
                           c["text_config"].erase("shared_expert_intermediate_size");
                         }),
                         {"config.json", "shared_expert_intermediate_size"});
}

// A huge expert count with the per-expert layout is refused from config.json
// and the router's first dimension at once, before anything is built in
// proportion to it (it used to run for minutes and end in bad_alloc).
TEST(BadMoe, HugeExpertCountRefusedEarly) {
  for (const int64_t n : {int64_t{1} << 40, int64_t{10000000}}) {
    SCOPED_TRACE(n);
    const auto edit = edit_config([n](ordered_json& c) { c["num_local_experts"] = n; });
    expect_convert_rejects("qwen3-moe-tiny", edit,
                           {"config.json", "num_local_experts", "expected 8",
                            "model.layers.0.mlp.gate.weight", std::to_string(n)});
    TempDir t;
    copy_checkpoint("qwen3-moe-tiny", t / "ckpt");
    edit(t / "ckpt");
    const RunResult r = run_program({program("inspect"), t / "ckpt"});
    expect_clean_failure(r, "inspect", {"config.json", "num_local_experts", std::to_string(n)});
  }
  // Without a router to compare with, the tensors held bound it.
  expect_convert_rejects("qwen3-moe-tiny",
                         [](const std::string& ckpt) {
                           edit_json(ckpt + "/config.json",
                                     [](ordered_json& c) { c["num_local_experts"] = 10000000; });
                           for (const char* shard : {"model-00001-of-00002.safetensors",
                                                     "model-00002-of-00002.safetensors"}) {
                             SafetensorsParts p = read_safetensors(ckpt + "/" + shard);
                             for (auto& [k, v] : p.header.items())
                               if (k.ends_with(".mlp.gate.weight")) {
                                 ordered_json h;
                                 for (auto& [k2, v2] : p.header.items())
                                   h[k2.ends_with(".mlp.gate.weight") ? k2 + "_x" : k2] = v2;
                                 p.header = h;
                                 break;
                               }
                             write_file(ckpt + "/" + shard, build_safetensors(p.header, p.data));
                           }
                           edit_json(ckpt + "/" + kIndex, [](ordered_json& j) {
                             ordered_json m;
                             for (auto& [k, v] : j["weight_map"].items())
                               m[k.ends_with(".mlp.gate.weight") ? k + "_x" : k] = v;
                             j["weight_map"] = m;
                           });
                         },
                         {"config.json", "num_local_experts", "at most", "10000000"});
}

// A layer that holds both the fused and the per-expert layout is named (it
// used to be blamed on another, intact layer).
TEST(BadMoe, LayerWithBothExpertLayoutsNamed) {
  expect_convert_rejects(
      "qwen3.5-moe-tiny-vlm",
      [](const std::string& ckpt) {
        const std::string fused = "model.language_model.layers.1.mlp.experts.gate_up_proj";
        const std::string extra = "model.language_model.layers.1.mlp.experts.0.down_proj.weight";
        std::string shard;
        edit_json(ckpt + "/" + kIndex, [&](ordered_json& j) {
          shard = j["weight_map"][fused].get<std::string>();
          j["weight_map"][extra] = shard;
        });
        SafetensorsParts p = read_safetensors(ckpt + "/" + shard);
        const uint64_t end = p.data.size();
        p.header[extra] = {
            {"dtype", "BF16"}, {"shape", {64, 32}}, {"data_offsets", {end, end + 4096}}};
        p.data.append(4096, '\0');
        write_file(ckpt + "/" + shard, build_safetensors(p.header, p.data));
      },
      {"layer layers.1", "both expert layouts",
       "model.language_model.layers.1.mlp.experts.down_proj",
       "model.language_model.layers.1.mlp.experts.0.down_proj.weight"});
}

// An expert tensor whose expert index is not a plain number ("-1", "+1",
// " 1") belongs to neither expert layout: it is named as an unexpected
// tensor, as "experts.07" is (it was reported as a fused tensor of a layer
// holding both layouts).
TEST(BadMoe, ExpertIndexThatIsNotANumber) {
  for (const std::string index : {"-1", "+1", " 1", "07"}) {
    SCOPED_TRACE(index);
    const std::string extra = "model.layers.0.mlp.experts." + index + ".gate_proj.weight";
    expect_convert_rejects(
        "qwen3-moe-tiny",
        [&](const std::string& ckpt) {
          const std::string shard = "model-00001-of-00002.safetensors";
          edit_json(ckpt + "/" + kIndex, [&](ordered_json& j) { j["weight_map"][extra] = shard; });
          SafetensorsParts p = read_safetensors(ckpt + "/" + shard);
          ordered_json like = p.header["model.layers.0.mlp.experts.0.gate_proj.weight"];
          const uint64_t bytes =
              like["data_offsets"][1].get<uint64_t>() - like["data_offsets"][0].get<uint64_t>();
          const uint64_t end = p.data.size();
          like["data_offsets"] = {end, end + bytes};
          p.header[extra] = like;
          p.data.append(bytes, '\0');
          write_file(ckpt + "/" + shard, build_safetensors(p.header, p.data));
        },
        {"tensor \"" + extra + "\"", "unexpected tensor"});
  }
}

}  // namespace
}  // namespace qtk::testing
