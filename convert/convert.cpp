#include "convert/convert.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <future>
#include <string_view>

#include "convert/atomic_output.h"
#include "convert/manifest.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/json.h"
#include "core/mapped_file.h"  // describe_file_type
#include "core/read_file.h"
#include "loaders/checkpoint.h"
#include "pack/pack.h"
#include "pack/pack_checksum.h"
#include "pack/pack_writer.h"
#include "tokenizer/chat/chat_request.h"
#include "tokenizer/chat/jinja_template.h"
#include "tokenizer/tokenizer.h"

namespace qtk {

namespace {

// The non-tensor files a pack carries when the checkpoint has them.
// note: chat_template.jinja is where newer checkpoints keep the chat
// template (transformers prefers it to tokenizer_config.json's
// "chat_template"); generate renders "messages" requests with it.
constexpr const char* kCarriedFiles[] = {"tokenizer.json", "tokenizer_config.json",
                                         "generation_config.json", "chat_template.jinja"};

// Parses a chat template with the runtime's Jinja parser; a syntax error
// names `what` ("PATH: field 'chat_template'" or "PATH") and the position.
void parse_chat_template(const std::string& text, const std::string& path,
                         const std::string& what) {
  try {
    (void)jinja::Template::parse(text, path);
  } catch (const jinja::TemplateError& e) {
    const std::string where =
        e.line() > 0 ? fmt::format(" (line {} column {} of the template)", e.line(), e.column())
                     : "";
    fail("{}: expected a Jinja template the runtime can parse, found one that does not{}: {}", what,
         where, e.python_form());
  }
}

// Refuses a chat template the runtime could not use: `chat_template` of
// tokenizer_config.json (a string, or a list of {"name", "template"} with
// one named "default") and chat_template.jinja are each read with the
// runtime's own reader (chat::template_from_config) and parsed with its Jinja
// parser, so a template that reaches the pack parses at generate time.
// note: generate gives a broken template to the chat lines only (per-line
// errors), so without this check a pack passed `inspect --verify` and then
// failed every "messages" request. Both are checked when both are present
// (generate then uses chat_template.jinja): the pack carries both files.
void check_chat_templates(const Checkpoint& ckpt, const nlohmann::json* tokenizer_config,
                          const std::optional<std::string>& jinja_text) {
  if (tokenizer_config != nullptr) {
    const std::string path = ckpt.file_path("tokenizer_config.json");
    if (auto text = chat::template_from_config(tokenizer_config, path, std::nullopt))
      parse_chat_template(*text, path, path + ": field 'chat_template'");
  }
  if (jinja_text) {
    const std::string path = ckpt.file_path("chat_template.jinja");
    parse_chat_template(*jinja_text, path, path);
  }
}

// Every file carried into the pack is refused unless it is a regular file
// (after symlinks) that the runtime will read as it is: tokenizer.json is
// parsed by the runtime's own tokenizer, the JSON files by the strict parser,
// the chat templates by the runtime's Jinja parser (check_chat_templates).
// note: a FIFO or a link to a device used to be skipped silently (or could
// block the read forever); a tokenizer the runtime refuses used to be packed.
void check_carried_files(const Checkpoint& ckpt) {
  std::optional<nlohmann::json> tokenizer_config;
  std::optional<std::string> jinja_text;
  for (const char* f : kCarriedFiles) {
    const std::string path = ckpt.file_path(f);
    struct stat lst {};
    if (::lstat(path.c_str(), &lst) != 0) continue;  // absent: not carried
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
      fail_errno(fmt::format("{}: cannot read it (a dangling symlink?)", path));
    if (!S_ISREG(st.st_mode)) {
      fail("{}: expected a regular file to carry into the pack, found {}", path,
           describe_file_type(st.st_mode));
    }
    std::string text = read_file_text(path, "it");
    if (std::string_view(f) == "tokenizer.json") {
      (void)Tokenizer::from_json_text(text, path);
    } else if (std::string_view(f) == "chat_template.jinja") {
      jinja_text = std::move(text);
    } else if (std::string_view(f) == "tokenizer_config.json") {
      tokenizer_config = parse_json_strict(text, path);
    } else {
      (void)parse_json_strict(text, path);
    }
  }
  check_chat_templates(ckpt, tokenizer_config ? &*tokenizer_config : nullptr, jinja_text);
}

// XXH64 of a whole file, read with pread in large blocks.
SourceFileDigest digest_file(const std::string& path, const std::string& name) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno(fmt::format("{}: cannot open", path));
  std::vector<uint8_t> buf(4u << 20);
  Xxh64 h;
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      ::close(fd);
      errno = saved;
      fail_errno(fmt::format("{}: read failed", path));
    }
    if (n == 0) break;
    h.update(buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
    if (interrupt_signal() != 0) break;  // the writer reports the interrupt
  }
  ::close(fd);
  return {name, total, h.digest()};
}

}  // namespace

namespace {

// note: with --force an existing OUT is replaced when the pack is
// committed, so an OUT that is the input archive or one of the files of the
// input directory would destroy what it was converted from: refused before
// any work. (A new OUT inside the input directory is fine.)
void refuse_output_over_input(const std::string& output, const std::string& input,
                              const struct stat& in) {
  struct stat out {};
  if (::stat(output.c_str(), &out) != 0) return;
  const auto same = [&](const struct stat& a) {
    return a.st_dev == out.st_dev && a.st_ino == out.st_ino;
  };
  if (same(in)) fail("{}: is the input itself; choose another output path", output);
  if (!S_ISDIR(in.st_mode)) return;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(input, ec)) {
    struct stat f {};
    if (::stat(e.path().c_str(), &f) == 0 && same(f))
      fail("{}: is {}a file of the input checkpoint; choose another output path", output,
           e.path().string() == output ? "" : e.path().string() + ", ");
  }
}

}  // namespace

MatrixDType parse_matrix_dtype(const std::string& text) {
  if (text == "keep") return std::nullopt;
  if (text == "bf16") return DType::BF16;
  if (text == "f16") return DType::F16;
  if (text == "f32") return DType::F32;
  fail("--dtype: expected keep, bf16, f16 or f32, found \"{}\"", text);
}

namespace {

// `text` with every `from` replaced by `to`.
std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// extraction_root: set to the private directory an archive input was
// extracted into, for convert_checkpoint's messages.
ConvertResult convert_checkpoint_at(const ConvertOptions& opt, std::string* extraction_root) {
  // The output first: an existing OUT (without --force) or an unwritable
  // directory fails before any work.
  AtomicOutput out(opt.output, opt.force);

  struct stat st {};
  if (::stat(opt.input.c_str(), &st) != 0)
    fail_errno(fmt::format("{}: cannot read the input", opt.input));
  refuse_output_over_input(opt.output, opt.input, st);
  std::unique_ptr<ExtractedArchive> extracted;
  std::string dir = opt.input;
  if (S_ISREG(st.st_mode)) {
    extracted = std::make_unique<ExtractedArchive>(opt.input, directory_of(opt.output), opt.limits);
    dir = extracted->checkpoint_dir();
    *extraction_root = extracted->root();
  } else if (!S_ISDIR(st.st_mode)) {
    fail("{}: expected a checkpoint directory or an archive file", opt.input);
  }

  auto ckpt = Checkpoint::open(dir);
  check_carried_files(*ckpt);
  const ModelConfig& config = ckpt->config();
  // The names messages use: the input as the user gave it.
  const std::string source = extracted ? opt.input : dir;

  // Source digests on the second core while the main thread writes.
  std::vector<std::pair<std::string, std::string>> digest_inputs;  // path, name
  for (const auto& p : ckpt->source_files()) digest_inputs.emplace_back(p, basename_of(p));
  for (const char* f : kCarriedFiles)
    if (ckpt->has_file(f) && std::string(f) != "generation_config.json")
      digest_inputs.emplace_back(ckpt->file_path(f), f);
  auto digests = std::async(std::launch::async, [digest_inputs] {
    std::vector<SourceFileDigest> out;
    for (const auto& [path, name] : digest_inputs) out.push_back(digest_file(path, name));
    return out;
  });

  std::unordered_map<std::string, const TensorView*> by_name;
  std::vector<std::string> all_names;
  for (const auto& t : ckpt->tensors()) {
    by_name.emplace(t.name, &t.view);
    all_names.push_back(t.name);
    // note: the loader paired and validated each FP8 weight's scales; the
    // plan finds them by the source name.
    if (t.scale.data != nullptr) by_name.emplace(fp8_source_scale_name(t.name), &t.scale);
  }
  const TensorLookup lookup = [&](const std::string& name) -> const TensorView* {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  };
  // note: the runtime has no FP8 embedding lookup (generate refuses such a
  // pack at load), so --dtype keep refuses it here, before any work.
  if (const CheckpointTensor* e = ckpt->find("embed_tokens.weight");
      e != nullptr && e->view.dtype == DType::F8_E4M3 && !opt.matrix_dtype)
    fail(
        "{}: tensor \"{}\" is F8_E4M3; an FP8 embedding table is not supported (expected BF16, "
        "F16 or F32); pass --dtype bf16 to dequantize it (--dtype keep keeps it FP8)",
        ckpt->file_path(e->file), e->hf_name);
  TensorPlan plan = plan_tensors(config, lookup, all_names, opt.matrix_dtype, source);
  // Messages about a piece's values name its file and Hugging Face name.
  std::unordered_map<const TensorView*, std::string> labels;
  for (const auto& t : ckpt->tensors())
    labels.emplace(&t.view, fmt::format("{}: tensor \"{}\"", ckpt->file_path(t.file), t.hf_name));
  for (auto& t : plan.tensors)
    for (Piece& p : t.pieces)
      if (p.origin != nullptr)
        if (const auto it = labels.find(p.origin); it != labels.end()) p.label = it->second;

  PackWriter writer(out.fd(), opt.output);
  ConvertResult result;
  for (const auto& t : plan.tensors) {
    writer.add(tensor_entry_name(t.name), make_tensor_source(t));
    result.tensor_bytes += t.nbytes();
  }
  for (const char* f : kCarriedFiles)
    if (ckpt->has_file(f))
      writer.add(f, make_bytes_source(read_file_text(ckpt->file_path(f), "it")));

  const int64_t max_new_tokens = ckpt->generation() ? ckpt->generation()->max_new_tokens : -1;
  writer.set_last("manifest.json", [&](const std::vector<WrittenEntry>& written) {
    ManifestInputs in;
    in.config = &config;
    in.source_files = digests.get();
    in.max_new_tokens = max_new_tokens;
    in.plan = &plan;
    in.written = &written;
    return build_manifest(in);
  });
  if (opt.progress) {
    writer.set_progress([&](uint64_t done, uint64_t total) {
      opt.progress(fmt::format(
          "convert: {:.0f} / {:.0f} MB ({:.0f}%)", done / 1e6, total / 1e6,
          total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0));
    });
  }
  std::vector<WrittenEntry> written;
  try {
    written = writer.write();
  } catch (...) {
    if (digests.valid()) digests.wait();  // never leave the thread running past the inputs
    throw;
  }

  // Re-read what was written: zip structure, alignment, manifest, sizes.
  try {
    auto check = Pack::open(out.temp_path());
    if (check->tensors().size() != plan.tensors.size())
      fail("{}: internal error: the written pack lists {} tensors, expected {}", opt.output,
           check->tensors().size(), plan.tensors.size());
  } catch (const Error& e) {
    // note: the message names the temporary file, which is gone by the time
    // the user reads it; name the output instead.
    fail("{} (reading back the pack just written)",
         replace_all(e.what(), out.temp_path(), opt.output));
  }
  struct stat ost {};
  if (::fstat(out.fd(), &ost) == 0) result.pack_bytes = static_cast<uint64_t>(ost.st_size);
  result.tensors = plan.tensors.size();
  result.entries = written.size();
  check_interrupted(opt.output);
  out.commit();
  return result;
}

}  // namespace

ConvertResult convert_checkpoint(const ConvertOptions& opt) {
  std::string root;
  try {
    return convert_checkpoint_at(opt, &root);
  } catch (const Error& e) {
    // note: a file of an archive input is read from a private directory,
    // removed by the time the message is read: it is named as the archive's
    // entry ("model.tar: m/config.json: ...").
    const std::string m = e.what();
    if (root.empty() || m.find(root) == std::string::npos) throw;
    throw Error(replace_all(replace_all(m, root + "/", opt.input + ": "), root, opt.input));
  }
}

}  // namespace qtk
