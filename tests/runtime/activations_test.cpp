// Per-layer check against the float64 reference activations of one prompt
// (fixtures activations.safetensors): the embedding, the output of every
// decoder layer, the final norm and the logits of every position.
#include <cmath>
#include <cstring>

#include "kernels/matmul.h"
#include "kernels/thread_pool.h"
#include "loaders/safetensors.h"
#include "pack/pack.h"
#include "runtime/model.h"
#include "runtime/scheduler.h"
#include "tests/runtime/test_util.h"

namespace qtk::rt_test {
namespace {

std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsTensor* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->view.dtype, DType::F32);
  std::vector<float> v(t->view.numel());
  std::memcpy(v.data(), t->view.data, v.size() * sizeof(float));
  return v;
}

// ||a - b|| / ||b|| over the whole tensor.
double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

class Activations : public ::testing::TestWithParam<const char*> {};

TEST_P(Activations, EveryLayerWithinTolerance) {
  const std::string dir = GetParam();
  const std::string pack_path = pack_of(dir);
  ASSERT_FALSE(pack_path.empty());
  auto pack = Pack::open(pack_path);
  auto act = SafetensorsFile::open(src(dir + "/activations.safetensors"));
  const auto* ids_t = act->find("prompt_token_ids");
  ASSERT_NE(ids_t, nullptr);
  std::vector<int64_t> ids64(ids_t->view.numel());
  std::memcpy(ids64.data(), ids_t->view.data, ids64.size() * sizeof(int64_t));
  const int64_t T = static_cast<int64_t>(ids64.size());
  const ModelConfig& cfg = pack->config();
  const int64_t H = cfg.hidden_size, L = cfg.num_layers;

  ThreadPool pool(2);
  auto model = load_model(*pack, &pool);
  // captured[i] = hidden_states.i in HF's numbering: 0 the embeddings,
  // i (1..L-1) the output of layer i-1, L the final norm.
  std::map<int64_t, std::vector<float>> captured;
  model->set_layer_hook([&](int64_t layer, const float* h, int64_t n, int64_t hs, int64_t ld) {
    std::vector<float> v(n * hs);
    for (int64_t t = 0; t < n; ++t) std::memcpy(v.data() + t * hs, h + t * ld, hs * sizeof(float));
    const int64_t index = layer == L ? L : layer + 1;
    if (layer == L - 1) return;  // HF records the final norm instead
    captured[index] = std::move(v);
  });
  SchedulerOptions so;
  so.max_batched_tokens = T;  // the whole prompt in one step
  so.max_num_seqs = 1;
  so.num_blocks = (T + 16) / 16 + 1;
  so.max_context = T + 1;
  Scheduler sched(*model, so);
  SequenceRequest r;
  for (int64_t id : ids64) r.prompt.push_back(static_cast<int32_t>(id));
  r.max_tokens = 1;
  sched.add(r);
  std::vector<int64_t> fin;
  sched.step(fin);
  ASSERT_EQ(fin.size(), 1u);
  ASSERT_EQ(static_cast<int64_t>(captured.size()), L + 1);

  // note: 1e-4 relative (Frobenius) error: float32 arithmetic against a
  // float64 reference, with identical bf16 weights; observed errors are ~1e-6.
  for (int64_t i = 0; i <= L; ++i) {
    const auto ref = read_f32(*act, fmt::format("hidden_states.{}", i));
    ASSERT_EQ(ref.size(), static_cast<size_t>(T * H));
    const double e = rel_error(captured[i], ref);
    EXPECT_LE(e, 1e-4) << "hidden_states." << i;
    std::printf("%s hidden_states.%lld rel error %.3g\n", dir.c_str(), static_cast<long long>(i),
                e);
  }
  // Logits of every position from the final-norm output and the pack's head.
  const TensorView& head =
      pack->find_tensor("lm_head") ? pack->tensor("lm_head") : pack->tensor("embed_tokens");
  std::vector<float> logits(T * cfg.vocab_size);
  matmul(captured[L].data(), H, head.data, head.dtype, logits.data(), cfg.vocab_size, T,
         cfg.vocab_size, H, &pool);
  const double e = rel_error(logits, read_f32(*act, "logits"));
  EXPECT_LE(e, 1e-4) << "logits";
  std::printf("%s logits rel error %.3g\n", dir.c_str(), e);
}

INSTANTIATE_TEST_SUITE_P(
    Models, Activations,
    ::testing::Values("tests/data/models/qwen3-tiny", "tests/data/models/qwen3-tiny-sharded-f32",
                      "tests/data/models/qwen3.5-tiny", "tests/data/models/qwen3.5-tiny-vlm",
                      "tests/data/models/qwen3-moe-tiny", "tests/data/models/qwen3.5-moe-tiny-vlm",
                      "tests/data/models/qwen3-fp8-tiny", "tests/data/models/qwen3.5-moe-fp8-tiny"),
    [](const auto& info) {
      std::string n = std::string(info.param).substr(std::string(info.param).rfind('/') + 1);
      for (char& ch : n)
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

}  // namespace
}  // namespace qtk::rt_test
