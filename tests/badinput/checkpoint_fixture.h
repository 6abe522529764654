// A writable copy of a fixture checkpoint, handed to `convert` after one
// mutation; the bad-input tests then check the CLI contract.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tests/badinput/run_util.h"

namespace qtk::testing {

// Copies the checkpoint files of fixture `model` (config.json,
// generation_config.json, the weights and index; not golden/activations) to
// dst.
void copy_checkpoint(const std::string& model, const std::string& dst);

// Copies `model`, applies `mutate(ckpt_dir)`, runs `convert ckpt out/x.pack`
// and expects a clean failure mentioning every needle and no output.
void expect_convert_rejects(const std::string& model,
                            const std::function<void(const std::string& ckpt)>& mutate,
                            const std::vector<std::string>& needles);

// The same, with extra convert arguments (e.g. {"--dtype", "f16"}).
void expect_convert_rejects(const std::string& model,
                            const std::function<void(const std::string& ckpt)>& mutate,
                            const std::vector<std::string>& needles,
                            const std::vector<std::string>& args);

// Rewrites a JSON file of the checkpoint through `edit`.
void edit_json(const std::string& path, const std::function<void(nlohmann::ordered_json&)>& edit);

}  // namespace qtk::testing
