#include "cli/model_commands.h"

#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "cli/args.h"
#include "model/checkpoint.h"
#include "model/generation_config.h"
#include "model/hf_tokenizer/hf_tokenizer.h"
#include "model/peft_adapter.h"
#include "model/sampling.h"
#include "services/torch_runtime.h"

namespace kappa::cli {
namespace {

constexpr const char* kLogitsUsage =
    "usage: kappa logits MODEL_DIR|ADAPTER_DIR --ids 1,5,9 [--device cpu|cuda[:N]] [--dtype "
    "float32|bfloat16|auto]\n";
constexpr const char* kGenerateUsage =
    "usage: kappa generate MODEL_DIR|ADAPTER_DIR (--prompt-ids 1,5,9 | --prompt TEXT) "
    "[--max-new-tokens N] "
    "[--temperature T]\n"
    "       [--top-p P] [--seed S] [--device cpu|cuda[:N]] [--dtype float32|bfloat16|auto]\n";
constexpr const char* kExportUsage =
    "usage: kappa export --merge ADAPTER_DIR OUT_DIR [--base BASE_DIR]\n";

// A comma-separated list of token ids, each in [0, vocab).
absl::StatusOr<std::vector<int64_t>> ParseIds(const std::string& flag, const std::string& text) {
  std::vector<int64_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(piece, &id) || id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", piece, "' is not a token id (comma-separated integers >= 0)"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::Status CheckIdsFit(const std::string& flag, const std::vector<int64_t>& ids,
                         const model::ModelConfig& config, int64_t extra_positions) {
  for (int64_t id : ids) {
    if (id >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": token id ", id, " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
  }
  if (static_cast<int64_t>(ids.size()) + extra_positions > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", ids.size(), " ids + ", extra_positions,
                                                   " new tokens exceed max_position_embeddings ",
                                                   config.max_position_embeddings));
  }
  return absl::OkStatus();
}

absl::StatusOr<model::LoadOptions> ParseLoadOptions(const CommandLine& line) {
  model::LoadOptions options;
  absl::StatusOr<torch::Device> device = services::ResolveDevice(line.Get("--device", "cpu"), "--device");
  if (!device.ok()) return device.status();
  options.device = *device;
  const std::string dtype_name = line.Get("--dtype", "float32");
  const std::optional<services::ModelDtype> dtype =
      services::ChoiceNamed<services::ModelDtype>(dtype_name);
  if (!dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype: '", dtype_name, "' is not a model dtype (auto | bfloat16 | float32)"));
  }
  options.dtype = services::ResolveModelDtype(*dtype, *device);
  return options;
}

template <typename T>
absl::StatusOr<T> NumberFlag(const CommandLine& line, const std::string& flag, T fallback) {
  if (!line.Has(flag)) return fallback;
  T value{};
  bool ok = false;
  if constexpr (std::is_floating_point_v<T>) {
    ok = absl::SimpleAtod(line.Get(flag), &value);
  } else {
    ok = absl::SimpleAtoi(line.Get(flag), &value);
  }
  if (!ok) return absl::InvalidArgumentError(absl::StrCat(flag, ": '", line.Get(flag), "' is not a number"));
  return value;
}

std::string JsonList(const std::vector<int64_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) absl::StrAppend(&s, i ? "," : "", ids[i]);
  return s + "]";
}

// Floats with 9 significant digits: enough to round-trip a float32.
template <typename Floats>
std::string JsonFloats(const Floats& values, size_t n) {
  std::string s = "[";
  char buffer[32];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buffer, sizeof(buffer), "%s%.9g", i ? "," : "", static_cast<double>(values[i]));
    s += buffer;
  }
  return s + "]";
}

// Where MODEL_DIR's tokenizer is: the directory itself, or, for a LoRA
// adapter directory (a run's checkpoint with student.lora), its base's.
// Throws std::runtime_error naming adapter_config.json when it is malformed.
std::string TokenizerDirOf(const std::string& dir) {
  return model::AdapterExists(dir) ? model::ReadAdapterConfig(dir).base_model_name_or_path : dir;
}

// The prompt of `kappa generate`: --prompt-ids as given, or --prompt TEXT
// encoded with MODEL_DIR's tokenizer.json (with its special tokens, as a raw
// prompt; render a chat prompt first with `kappa render-prompt`).
struct GeneratePrompt {
  std::string flag;  // which one was given, for messages
  std::vector<int64_t> ids;
  std::optional<model::HfTokenizer> tokenizer;  // with --prompt: to decode the response too
};

absl::StatusOr<GeneratePrompt> ReadGeneratePrompt(const CommandLine& line) {
  GeneratePrompt prompt;
  if (line.Has("--prompt-ids")) {
    prompt.flag = "--prompt-ids";
    absl::StatusOr<std::vector<int64_t>> ids = ParseIds("--prompt-ids", line.Get("--prompt-ids"));
    if (!ids.ok()) return ids.status();
    prompt.ids = *std::move(ids);
    return prompt;
  }
  prompt.flag = "--prompt";
  // The tokenizer's errors name the file.
  KAPPA_RETURN_IF_ERROR(base::CaptureExceptions(
      "--prompt",
      [&] {
        prompt.tokenizer = model::HfTokenizer::Load(TokenizerDirOf(line.config_path));
        prompt.ids = prompt.tokenizer->Encode(line.Get("--prompt"), /*add_special_tokens=*/true);
      },
      absl::StatusCode::kInvalidArgument));
  if (prompt.ids.empty())
    return absl::InvalidArgumentError("--prompt: the text encodes to no tokens");
  return prompt;
}

int UsageError(const char* command, const absl::Status& status, const char* usage) {
  std::cerr << "kappa " << command << ": " << status.message() << "\n" << usage;
  return 2;
}

// A failure of the model code at run time (a checkpoint it cannot load, a
// forward that throws): exit code 1.
int RunError(const char* command, const absl::Status& status) {
  std::cerr << "kappa " << command << ": " << status.message() << "\n";
  return 1;
}

// True when `args` hold an argument that is neither a flag nor a value of
// one of `value_flags` (ParseCommandLine would take it for the CONFIG).
bool HasPositional(const std::vector<std::string>& args, const std::set<std::string>& value_flags) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind("--", 0) != 0) return true;
    if (value_flags.count(args[i]) > 0) ++i;  // "--flag VALUE"; "--flag=VALUE" is one argument
  }
  return false;
}

}  // namespace

int LogitsCommand(const std::vector<std::string>& args) {
  absl::StatusOr<CommandLine> line = ParseCommandLine(args, {"--ids", "--device", "--dtype"}, {});
  if (!line.ok()) return UsageError("logits", line.status(), kLogitsUsage);
  if (!line->overrides.empty() || !line->Has("--ids")) {
    return UsageError("logits", absl::InvalidArgumentError("MODEL_DIR and --ids are required"), kLogitsUsage);
  }
  absl::StatusOr<std::vector<int64_t>> ids = ParseIds("--ids", line->Get("--ids"));
  if (!ids.ok()) return UsageError("logits", ids.status(), kLogitsUsage);
  absl::StatusOr<model::LoadOptions> options = ParseLoadOptions(*line);
  if (!options.ok()) return UsageError("logits", options.status(), kLogitsUsage);
  absl::StatusOr<model::Decoder> decoder = base::CaptureExceptions(
      "", [&] { return model::LoadModelOrAdapter(line->config_path, *options); });
  if (!decoder.ok()) return RunError("logits", decoder.status());
  if (absl::Status fit = CheckIdsFit("--ids", *ids, (*decoder)->config(), 0); !fit.ok()) {
    return UsageError("logits", fit, kLogitsUsage);
  }
  absl::StatusOr<std::string> out = base::CaptureExceptions("", [&] {
    torch::NoGradGuard no_grad;
    (*decoder)->eval();
    auto tokens = torch::tensor(*ids, torch::kInt64).unsqueeze(0);
    auto logits =
        (*decoder)->Forward(tokens).logits[0].to(torch::kCPU, torch::kFloat32).contiguous();
    const int64_t V = logits.size(1);
    std::string json = "{\"ids\":" + JsonList(*ids) + ",\"logits\":[";
    for (int64_t t = 0; t < logits.size(0); ++t) {
      json += (t ? "," : "") + JsonFloats(logits[t].data_ptr<float>(), static_cast<size_t>(V));
    }
    return json + "]}";
  });
  if (!out.ok()) return RunError("logits", out.status());
  std::cout << *out << "\n";
  return 0;
}

int GenerateCommand(const std::vector<std::string>& args) {
  absl::StatusOr<CommandLine> line = ParseCommandLine(
      args, {"--prompt-ids", "--prompt", "--max-new-tokens", "--temperature", "--top-p", "--seed", "--device", "--dtype"},
      {});
  if (!line.ok()) return UsageError("generate", line.status(), kGenerateUsage);
  if (!line->overrides.empty() || line->Has("--prompt-ids") == line->Has("--prompt")) {
    return UsageError(
        "generate",
        absl::InvalidArgumentError("MODEL_DIR and one of --prompt-ids or --prompt are required"),
        kGenerateUsage);
  }
  absl::StatusOr<GeneratePrompt> prompt = ReadGeneratePrompt(*line);
  absl::StatusOr<int64_t> max_new = NumberFlag<int64_t>(*line, "--max-new-tokens", 32);
  absl::StatusOr<double> temperature = NumberFlag<double>(*line, "--temperature", 1.0);
  absl::StatusOr<double> top_p = NumberFlag<double>(*line, "--top-p", 1.0);
  absl::StatusOr<int64_t> seed = NumberFlag<int64_t>(*line, "--seed", 0);
  absl::StatusOr<model::LoadOptions> options = ParseLoadOptions(*line);
  for (const absl::Status& s : {prompt.status(), max_new.status(), temperature.status(), top_p.status(),
                                seed.status(), options.status()}) {
    if (!s.ok()) return UsageError("generate", s, kGenerateUsage);
  }
  if (*max_new < 1 || *temperature < 0 || !(*top_p > 0 && *top_p <= 1)) {
    return UsageError("generate",
                      absl::InvalidArgumentError("need --max-new-tokens >= 1, --temperature >= 0, 0 < --top-p <= 1"),
                      kGenerateUsage);
  }
  absl::StatusOr<model::Decoder> decoder = base::CaptureExceptions(
      "", [&] { return model::LoadModelOrAdapter(line->config_path, *options); });
  if (!decoder.ok()) return RunError("generate", decoder.status());
  const model::ModelConfig& config = (*decoder)->config();
  if (absl::Status fit = CheckIdsFit(prompt->flag, prompt->ids, config, *max_new); !fit.ok()) {
    return UsageError("generate", fit, kGenerateUsage);
  }
  absl::Status generated = base::CaptureExceptions("", [&] {
    (*decoder)->eval();
    model::SamplingParams params;
    params.max_new_tokens = *max_new;
    params.temperature = *temperature;
    params.top_p = *top_p;
    params.stop_token_ids = model::StopTokenIds(config);
    params.pad_id = config.pad_token_id;
    // With a tokenizer, padded embedding rows are never sampled.
    if (prompt->tokenizer) {
      params.sampleable_vocab_size = model::VocabLimit(config, prompt->tokenizer->vocab_size());
    }
    at::Generator generator = model::MakeGenerator(options->device, static_cast<uint64_t>(*seed));
    const model::SampledSequence sample =
        model::Sample(*decoder, {prompt->ids}, params, generator).at(0);
    const bool finished = !sample.truncated;
    std::cout << "{\"prompt_ids\":" << JsonList(prompt->ids)
              << ",\"ids\":" << JsonList(sample.tokens)
              << ",\"logprobs\":" << JsonFloats(sample.logprobs, sample.logprobs.size())
              << ",\"finished\":" << (finished ? "true" : "false");
    if (prompt->tokenizer) {
      std::cout << ",\"text\":"
                << nlohmann::json(
                       prompt->tokenizer->Decode(sample.tokens, /*skip_special_tokens=*/true))
                       .dump();
    }
    std::cout << "}\n";
  });
  if (!generated.ok()) return RunError("generate", generated);
  return 0;
}

int ExportCommand(const std::vector<std::string>& args) {
  const std::set<std::string> value_flags = {"--merge", "--base"};
  if (!HasPositional(args, value_flags)) {
    return UsageError("export", absl::InvalidArgumentError("missing OUT_DIR"), kExportUsage);
  }
  absl::StatusOr<CommandLine> line = ParseCommandLine(args, value_flags, {});
  if (!line.ok()) return UsageError("export", line.status(), kExportUsage);
  if (!line->overrides.empty()) {
    return UsageError(
        "export",
        absl::InvalidArgumentError(absl::StrCat("unexpected argument '", line->overrides[0], "'")),
        kExportUsage);
  }
  if (!line->Has("--merge")) {
    return UsageError("export",
                      absl::InvalidArgumentError(
                          "--merge ADAPTER_DIR is required (merging an adapter is the one export)"),
                      kExportUsage);
  }
  const std::string adapter_dir = line->Get("--merge"), out_dir = line->config_path;
  absl::StatusOr<std::string> base = base::CaptureExceptions(
      "", [&] { return model::ExportMergedAdapter(adapter_dir, out_dir, line->Get("--base")); });
  if (!base.ok()) return RunError("export", base.status());
  std::cerr << "kappa export: wrote " << out_dir << " (" << adapter_dir << " merged into " << *base
            << ")\n";
  return 0;
}

}  // namespace kappa::cli
