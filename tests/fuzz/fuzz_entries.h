// The fuzz entry points: one per parser, each `int f(const uint8_t*, size_t)`
// with libFuzzer's contract (return 0; crash on a finding). fuzz_main.cpp
// turns one of them into a libFuzzer binary (-DQTK_FUZZ_ENTRY=name); the
// replay test (replay_test.cpp) feeds every kept crasher and seed to the same
// function in the normal build.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qtk::fuzz {

// SafetensorsFile::open on the bytes as a .safetensors file.
int safetensors_header(const uint8_t* data, size_t size);
// Checkpoint::open on a directory whose model.safetensors.index.json is the
// bytes (config.json and shards: the qwen3-tiny-sharded-f32 fixture).
int shard_index(const uint8_t* data, size_t size);
// parse_json_strict + parse_hf_config + the manifest round trip, and
// parse_generation_config on the same document.
int hf_config(const uint8_t* data, size_t size);
// Pack::open (and verify) on the bytes as a .pack file.
int pack_zip(const uint8_t* data, size_t size);
// Tokenizer::from_json_text on the bytes, then encode/decode with it.
int tokenizer_json(const uint8_t* data, size_t size);
// The real Qwen3 tokenizer (loaded once): byte 0 picks encode or decode.
int tokenizer_codec(const uint8_t* data, size_t size);
// runtime's parse_prompt_line on the bytes as one --batch line.
int prompt_jsonl(const uint8_t* data, size_t size);
// The chat template renderer: byte 0 even: the rest is a template rendered
// with a fixed chat request; odd: a request line rendered with the three
// real Qwen templates.
int chat_template(const uint8_t* data, size_t size);

}  // namespace qtk::fuzz
