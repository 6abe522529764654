// Bad safetensors files handed to the real `convert` (and `inspect`): every
// case must end with exit status 1, one stderr line naming the file and the
// problem, no signal and no output file.
#include <cstring>
#include <string>

#include "tests/badinput/checkpoint_fixture.h"

namespace qtk::testing {
namespace {

using nlohmann::ordered_json;

const char* const kModel = "qwen3-tiny";

// Replaces the checkpoint's model.safetensors with `bytes`.
auto replace_weights(std::string bytes) {
  return [bytes = std::move(bytes)](const std::string& ckpt) {
    write_file(ckpt + "/model.safetensors", bytes);
  };
}

// Applies `edit` to the fixture's parsed header and data, then rebuilds.
auto edit_weights(std::function<void(ordered_json& header, std::string& data)> edit) {
  return [edit](const std::string& ckpt) {
    SafetensorsParts p = read_safetensors(ckpt + "/model.safetensors");
    edit(p.header, p.data);
    write_file(ckpt + "/model.safetensors", build_safetensors(p.header, p.data));
  };
}

// The first tensor entry of the header (not __metadata__).
ordered_json& first_tensor(ordered_json& h) {
  for (auto& [k, v] : h.items())
    if (k != "__metadata__") return v;
  throw std::runtime_error("no tensor");
}

// Name of the tensor with the largest offsets (the last in the data).
std::string last_tensor_name(const ordered_json& h) {
  std::string best;
  uint64_t end = 0;
  for (auto& [k, v] : h.items())
    if (k != "__metadata__" && v["data_offsets"][1].get<uint64_t>() >= end)
      end = v["data_offsets"][1].get<uint64_t>(), best = k;
  return best;
}

TEST(BadSafetensors, TruncatedAtEveryStructuralBoundary) {
  const std::string full = read_file(model_fixture(kModel) + "/model.safetensors");
  const SafetensorsParts p = read_safetensors(model_fixture(kModel) + "/model.safetensors");
  const uint64_t n = full.size() - p.data.size() - 8;
  // Inside and at the end of the length field, inside and at the end of the
  // header, then at every tensor's first byte and one past it, and one byte
  // short of the end.
  std::vector<uint64_t> cuts = {0, 1, 7, 8, 9, 8 + n / 2, 8 + n - 1, 8 + n};
  for (auto& [name, t] : p.header.items()) {
    if (name == "__metadata__") continue;
    const uint64_t start = 8 + n + t["data_offsets"][0].get<uint64_t>();
    cuts.push_back(start);
    cuts.push_back(start + 1);
  }
  cuts.push_back(full.size() - 1);
  for (uint64_t cut : cuts) {
    SCOPED_TRACE("truncated to " + std::to_string(cut) + " of " + std::to_string(full.size()) + " bytes");
    expect_convert_rejects(kModel, replace_weights(full.substr(0, cut)), {"model.safetensors"});
  }
}

TEST(BadSafetensors, HeaderLengthPastTheEnd) {
  std::string bytes = read_file(model_fixture(kModel) + "/model.safetensors");
  const uint64_t n = bytes.size();  // 8 + n > size
  std::memcpy(bytes.data(), &n, 8);
  expect_convert_rejects(kModel, replace_weights(bytes), {"model.safetensors", "header"});
}

TEST(BadSafetensors, HeaderLengthOverTheLimit) {
  // 100 MB + 8 of header in a file that really is that long (sparse), so
  // the only thing wrong is the limit.
  expect_convert_rejects(
      kModel,
      [](const std::string& ckpt) {
        const uint64_t n = 100'000'008;
        std::string head(8, '\0');
        std::memcpy(head.data(), &n, 8);
        head += "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}";
        write_file(ckpt + "/model.safetensors", head);
        std::filesystem::resize_file(ckpt + "/model.safetensors", 8 + n + 4);
      },
      {"model.safetensors", "100000000"});
}

TEST(BadSafetensors, HeaderNotUtf8) {
  const SafetensorsParts p = read_safetensors(model_fixture(kModel) + "/model.safetensors");
  std::string text = p.header.dump();
  const size_t q = text.find("\"", 1);  // inside the first key
  text.insert(q, "\xff\xfe");
  expect_convert_rejects(kModel, replace_weights(build_safetensors_raw(text, p.data)),
                         {"model.safetensors", "utf-8"});
}

TEST(BadSafetensors, HeaderNotAnObject) {
  expect_convert_rejects(kModel, replace_weights(build_safetensors_raw("[1, 2, 3]", "")),
                         {"model.safetensors", "object"});
  expect_convert_rejects(kModel, replace_weights(build_safetensors_raw("{\"a\": ", "")),
                         {"model.safetensors"});
  expect_convert_rejects(kModel, replace_weights(build_safetensors_raw("", "")), {"model.safetensors"});
}

TEST(BadSafetensors, DuplicateTensorName) {
  const SafetensorsParts p = read_safetensors(model_fixture(kModel) + "/model.safetensors");
  // The same name twice, each with a valid entry of its own size.
  const std::string text =
      "{\"dup.weight\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
      "\"dup.weight\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}";
  expect_convert_rejects(kModel, replace_weights(build_safetensors_raw(text, std::string(8, '\0'))),
                         {"model.safetensors", "dup.weight"});
}

TEST(BadSafetensors, UnknownDtype) {
  expect_convert_rejects(kModel, edit_weights([](ordered_json& h, std::string&) {
                           first_tensor(h)["dtype"] = "BF17";
                         }),
                         {"model.safetensors", "BF17"});
}

TEST(BadSafetensors, NegativeHugeAndOverflowingShapes) {
  for (const ordered_json& shape :
       {ordered_json::parse("[-1, 64]"), ordered_json::parse("[4294967296, 4294967296]"),
        ordered_json::parse("[9223372036854775807, 2]"), ordered_json::parse("[18446744073709551615]"),
        ordered_json::parse("[1.5]"), ordered_json::parse("[1,1,1,1,1,1,1,1,1,1]"),
        ordered_json::parse("\"64\"")}) {
    SCOPED_TRACE("shape " + shape.dump());
    expect_convert_rejects(kModel, edit_weights([&](ordered_json& h, std::string&) {
                             first_tensor(h)["shape"] = shape;
                           }),
                           {"model.safetensors", "shape"});
  }
}

TEST(BadSafetensors, OffsetsWithGapsOverlapsAndTrailingBytes) {
  // Gap: the first tensor starts at 4 (its end moves with it).
  expect_convert_rejects(kModel, edit_weights([](ordered_json& h, std::string& data) {
                           for (auto& [k, v] : h.items()) {
                             if (k == "__metadata__") continue;
                             v["data_offsets"][0] = v["data_offsets"][0].get<uint64_t>() + 4;
                             v["data_offsets"][1] = v["data_offsets"][1].get<uint64_t>() + 4;
                           }
                           data.insert(0, 4, '\0');
                         }),
                         {"model.safetensors"});
  // Overlap: the last tensor starts 2 bytes early (and so ends 2 early).
  expect_convert_rejects(kModel, edit_weights([](ordered_json& h, std::string& data) {
                           auto& t = h[last_tensor_name(h)];
                           t["data_offsets"][0] = t["data_offsets"][0].get<uint64_t>() - 2;
                           t["data_offsets"][1] = t["data_offsets"][1].get<uint64_t>() - 2;
                           data.resize(data.size() - 2);
                         }),
                         {"model.safetensors"});
  // Trailing bytes after the last tensor.
  expect_convert_rejects(kModel, edit_weights([](ordered_json&, std::string& data) { data += "xyz"; }),
                         {"model.safetensors"});
  // Offsets that disagree with the shape.
  expect_convert_rejects(kModel, edit_weights([](ordered_json& h, std::string&) {
                           auto& t = first_tensor(h);
                           t["data_offsets"][1] = t["data_offsets"][1].get<uint64_t>() + 2;
                         }),
                         {"model.safetensors"});
  // Offsets past the end of the file (and an overflowing end).
  expect_convert_rejects(kModel, edit_weights([](ordered_json& h, std::string&) {
                           auto& t = h[last_tensor_name(h)];
                           t["data_offsets"][1] = UINT64_MAX;
                         }),
                         {"model.safetensors"});
}

TEST(BadSafetensors, InspectRejectsTheSameWay) {
  // inspect MODEL_DIR goes through the same loader; one representative case.
  TempDir t;
  copy_checkpoint(kModel, t / "ckpt");
  write_file(t / "ckpt/model.safetensors", build_safetensors_raw("[]", ""));
  expect_clean_failure(run_program({program("inspect"), t / "ckpt"}), "inspect",
                       {"model.safetensors", "object"});
}

}  // namespace
}  // namespace qtk::testing
