#include "tests/badinput/checkpoint_fixture.h"

#include <filesystem>

namespace qtk::testing {

namespace fs = std::filesystem;

void copy_checkpoint(const std::string& model, const std::string& dst) {
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(model_fixture(model))) {
    const std::string name = e.path().filename().string();
    if (name == "golden.json" || name == "activations.safetensors") continue;
    fs::copy_file(e.path(), dst + "/" + name);
    fs::permissions(dst + "/" + name, fs::perms::owner_read | fs::perms::owner_write);
  }
}

void expect_convert_rejects(const std::string& model,
                            const std::function<void(const std::string& ckpt)>& mutate,
                            const std::vector<std::string>& needles) {
  expect_convert_rejects(model, mutate, needles, {});
}

void expect_convert_rejects(const std::string& model,
                            const std::function<void(const std::string& ckpt)>& mutate,
                            const std::vector<std::string>& needles,
                            const std::vector<std::string>& args) {
  TempDir t;
  const std::string ckpt = t / "ckpt";
  const std::string out = t / "out";
  fs::create_directories(out);
  copy_checkpoint(model, ckpt);
  mutate(ckpt);
  std::vector<std::string> argv = {program("convert"), ckpt, out + "/x.pack"};
  argv.insert(argv.end(), args.begin(), args.end());
  const RunResult r = run_program(argv);
  expect_clean_failure(r, "convert", needles);
  expect_no_output(out, "x.pack", {});
}

void edit_json(const std::string& path, const std::function<void(nlohmann::ordered_json&)>& edit) {
  auto j = nlohmann::ordered_json::parse(read_file(path));
  edit(j);
  write_file(path, j.dump(2));
}

}  // namespace qtk::testing
