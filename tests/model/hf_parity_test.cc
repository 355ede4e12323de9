// kappa's decoder against an independent reference: tests/model/reference/
// hf_forward.py, a plain PyTorch forward written from Hugging Face's modeling
// code, run on the tiny random HF checkpoints that make_checkpoints.py writes
// (ctest fixture hf_checkpoints). Every variant (Llama tied/GQA/llama3 and
// linear RoPE scaling/biases, Qwen2 biases/sharded/tied, Qwen3 q/k norms and
// a head_dim apart from hidden/heads, fp32/bf16/fp16 on disk) must give the
// reference's fp32 logits within 1e-4: full batches, left-padded batches, and
// token by token through the KV cache. Then load -> save -> load is
// bit-identical, and the reference reads what kappa wrote. A LoRA adapter
// kappa saves (model/peft_adapter.h) is read by the reference itself
// (--adapter: PEFT's file layout, merged as PEFT merges) and gives kappa's
// unmerged forward, per family, α/r and rsLoRA's α/√r.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/peft_adapter.h"

#ifndef KAPPA_HF_CHECKPOINTS
#error "KAPPA_HF_CHECKPOINTS (the fixture's output directory) must be defined"
#endif

namespace kappa::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr double kTolerance = 1e-4;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

fs::path ScratchDir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("kappa_hf_parity_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The reference's logits [B, T, V] for `ids` (rows padded on the left where
// `mask` is 0), with the PEFT adapter `adapter_dir` merged when given.
torch::Tensor ReferenceLogits(const std::string& model_dir, const torch::Tensor& ids,
                              const torch::Tensor& mask, const std::string& adapter_dir = "") {
  const fs::path scratch = ScratchDir("request");
  Json request;
  request["input_ids"] = Json::array();
  request["attention_mask"] = Json::array();
  for (int64_t b = 0; b < ids.size(0); ++b) {
    std::vector<int64_t> row(ids[b].data_ptr<int64_t>(), ids[b].data_ptr<int64_t>() + ids.size(1));
    std::vector<int64_t> m(mask[b].data_ptr<int64_t>(), mask[b].data_ptr<int64_t>() + ids.size(1));
    request["input_ids"].push_back(row);
    request["attention_mask"].push_back(m);
  }
  std::ofstream(scratch / "request.json") << request.dump();
  const std::string command =
      std::string(KAPPA_REFERENCE_PYTHON) + " " + KAPPA_REFERENCE_DIR + "/hf_forward.py " +
      model_dir + (adapter_dir.empty() ? "" : " --adapter " + adapter_dir) + " < " +
      (scratch / "request.json").string() + " > " + (scratch / "logits.json").string();
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  const Json logits = Json::parse(ReadText(scratch / "logits.json"))["logits"];
  const int64_t B = ids.size(0), T = ids.size(1), V = static_cast<int64_t>(logits[0][0].size());
  auto out = torch::empty({B, T, V}, torch::kFloat64);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      out[b][t] = torch::tensor(logits[b][t].get<std::vector<double>>(), torch::kFloat64);
    }
  }
  fs::remove_all(scratch);
  return out.to(torch::kFloat32);
}

// Largest |a - b| over the positions where mask is 1.
double MaxDiffAtRealPositions(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& mask) {
  auto diff = (a - b).abs().amax(-1);  // [B, T]
  return diff.masked_select(mask.to(torch::kBool)).max().item<double>();
}

// Three rows of lengths T, T-3 and T-5, left-padded; ids from the model's vocabulary.
struct Batch {
  torch::Tensor ids;   // [3, T] int64
  torch::Tensor mask;  // [3, T] int64
};
Batch LeftPaddedBatch(int64_t vocab, int64_t T, uint64_t seed) {
  torch::manual_seed(seed);
  Batch batch{torch::randint(3, vocab, {3, T}, torch::kInt64), torch::ones({3, T}, torch::kInt64)};
  const int64_t pads[] = {0, 3, 5};
  for (int64_t b = 0; b < 3; ++b) {
    batch.mask[b].narrow(0, 0, pads[b]).fill_(0);
    batch.ids[b].narrow(0, 0, pads[b]).fill_(0);
  }
  return batch;
}

// Logits position by position through the KV cache: the first `prefill`
// positions in one call, then one token per call.
torch::Tensor CachedLogits(Decoder& model, const Batch& batch, int64_t prefill) {
  const int64_t B = batch.ids.size(0), T = batch.ids.size(1);
  KVCache cache = model->NewCache(B, T);
  std::vector<torch::Tensor> pieces;
  pieces.push_back(model->Forward(batch.ids.narrow(1, 0, prefill), batch.mask.narrow(1, 0, prefill), {}, &cache).logits);
  for (int64_t t = prefill; t < T; ++t) {
    pieces.push_back(model->Forward(batch.ids.narrow(1, t, 1), batch.mask.narrow(1, t, 1), {}, &cache).logits);
  }
  return torch::cat(pieces, 1);
}

class HfParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string Dir() const { return std::string(KAPPA_HF_CHECKPOINTS) + "/" + GetParam(); }
};

TEST_P(HfParityTest, LogitsEqualTheReference) {
  torch::NoGradGuard no_grad;
  Decoder model = LoadCheckpoint(Dir());
  const Batch batch = LeftPaddedBatch(model->config().vocab_size, 12, 11);
  const torch::Tensor reference = ReferenceLogits(Dir(), batch.ids, batch.mask);

  const auto full_mask = torch::ones_like(batch.mask);
  const torch::Tensor unpadded = model->Forward(batch.ids.narrow(0, 0, 1)).logits;
  EXPECT_LT(MaxDiffAtRealPositions(unpadded, reference.narrow(0, 0, 1), full_mask.narrow(0, 0, 1)), kTolerance)
      << "unpadded row";
  const torch::Tensor padded = model->Forward(batch.ids, batch.mask).logits;
  EXPECT_LT(MaxDiffAtRealPositions(padded, reference, batch.mask), kTolerance) << "left-padded batch";
  const torch::Tensor cached = CachedLogits(model, batch, 6);
  EXPECT_LT(MaxDiffAtRealPositions(cached, reference, batch.mask), kTolerance) << "KV cache";
  std::printf("%s: max |kappa - reference| full %.2e, left-padded %.2e, KV cache %.2e\n",
              GetParam().c_str(),
              MaxDiffAtRealPositions(unpadded, reference.narrow(0, 0, 1), full_mask.narrow(0, 0, 1)),
              MaxDiffAtRealPositions(padded, reference, batch.mask),
              MaxDiffAtRealPositions(cached, reference, batch.mask));
  if (SdpaAvailable()) {
    SetAttentionBackend(AttentionKind::kExplicit);
    const torch::Tensor explicit_path = model->Forward(batch.ids, batch.mask).logits;
    SetAttentionBackend(AttentionKind::kSdpa);
    EXPECT_LT(MaxDiffAtRealPositions(explicit_path, padded, batch.mask), kTolerance) << "SDPA vs explicit";
  }
}

// Loaded in the dtype of its files and saved again, a checkpoint keeps every
// tensor's bytes and every config.json key; the reference reads kappa's copy.
TEST_P(HfParityTest, SaveLoadRoundTripIsExact) {
  torch::NoGradGuard no_grad;
  const ModelConfig source_config = ReadModelConfig(Dir());
  const torch::ScalarType disk_dtype = CheckpointWeights::Open(Dir()).tensors().begin()->second.entry->dtype;
  Decoder model = LoadCheckpoint(Dir(), {torch::kCPU, disk_dtype});
  const fs::path out = ScratchDir(GetParam());
  // Small shards for one variant, so kappa's shard writer is read back too.
  SaveOptions options;
  if (GetParam() == "qwen3_tied_fp32") options.max_shard_bytes = 40'000;
  SaveCheckpoint((out / "ckpt").string(), model, options);
  const std::string saved = (out / "ckpt").string();
  if (GetParam() == "qwen3_tied_fp32") {
    EXPECT_TRUE(fs::exists(out / "ckpt" / kSafetensorsIndexFile));
  }

  EXPECT_EQ(Json::parse(ReadText(saved + "/config.json")), Json::parse(ReadText(Dir() + "/config.json")));
  for (const char* name : {"generation_config.json", "tokenizer_config.json"}) {
    EXPECT_EQ(ReadText(saved + "/" + name), ReadText(Dir() + "/" + std::string(name))) << name;
  }
  const CheckpointWeights original = CheckpointWeights::Open(Dir());
  const CheckpointWeights copy = CheckpointWeights::Open(saved);
  ASSERT_EQ(original.tensors().size(), copy.tensors().size());
  for (const auto& [name, located] : original.tensors()) {
    ASSERT_EQ(copy.tensors().count(name), 1u) << name;
    const torch::Tensor a = located.file->View(name);
    const torch::Tensor b = copy.tensors().at(name).file->View(name);
    EXPECT_EQ(a.scalar_type(), b.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(a, b)) << name << " changed in the round trip";
  }
  Decoder again = LoadCheckpoint(saved);
  EXPECT_TRUE(SameNetwork(again->config(), source_config));

  const Batch batch = LeftPaddedBatch(source_config.vocab_size, 8, 5);
  const torch::Tensor reference = ReferenceLogits(saved, batch.ids, batch.mask);
  EXPECT_LT(MaxDiffAtRealPositions(again->Forward(batch.ids, batch.mask).logits, reference, batch.mask),
            kTolerance);
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Variants, HfParityTest,
                         ::testing::Values("llama_tied_fp32", "llama_gqa_llama3rope_bf16",
                                           "llama_linear_rope_bias", "qwen2_bias_sharded",
                                           "qwen2_tied_bf16", "qwen3_qknorm_headdim",
                                           "qwen3_tied_fp32", "qwen3_attn_bias_fp16"));

// One family's fixture with a LoRA adapter on all seven projections.
struct AdapterCase {
  std::string variant;
  bool use_rslora;
};
void PrintTo(const AdapterCase& c, std::ostream* os) {
  *os << c.variant << (c.use_rslora ? " rsLoRA" : "");
}

class HfAdapterParityTest : public ::testing::TestWithParam<AdapterCase> {
 protected:
  std::string Dir() const { return std::string(KAPPA_HF_CHECKPOINTS) + "/" + GetParam().variant; }
};

// Random nonzero adapters (A and B), saved as PEFT saves them.
TEST_P(HfAdapterParityTest, UnmergedAdapterEqualsTheReferenceMerge) {
  torch::NoGradGuard no_grad;
  Decoder model = LoadCheckpoint(Dir());
  const Batch batch = LeftPaddedBatch(model->config().vocab_size, 10, 23);
  const torch::Tensor base = model->Forward(batch.ids, batch.mask).logits;
  LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 8.0;
  lora.use_rslora = GetParam().use_rslora;
  lora.target_modules = LoraTargetNames();
  model->EnableLora(lora);
  torch::manual_seed(17);
  for (auto& [name, tensor] : NamedAdapters(model)) {
    torch::Tensor t = tensor;
    t.copy_(torch::randn_like(t) * 0.1);
  }
  const fs::path out = ScratchDir("adapter_" + GetParam().variant);
  const std::string adapter = (out / "adapter").string();
  SaveAdapter(adapter, model, lora, Dir());

  const torch::Tensor reference = ReferenceLogits(Dir(), batch.ids, batch.mask, adapter);
  const torch::Tensor adapted = model->Forward(batch.ids, batch.mask).logits;
  const double diff = MaxDiffAtRealPositions(adapted, reference, batch.mask);
  EXPECT_LT(diff, kTolerance) << "unmerged adapter vs the reference's merge";
  // The adapters matter: the base alone is far from the reference.
  const double effect = MaxDiffAtRealPositions(base, reference, batch.mask);
  EXPECT_GT(effect, 100 * kTolerance) << "the adapter hardly changes the logits";
  std::printf(
      "%s%s: max |kappa adapter - reference merge| %.2e (the adapter moves logits by %.2e)\n",
      GetParam().variant.c_str(), GetParam().use_rslora ? " rsLoRA" : "", diff, effect);
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Families, HfAdapterParityTest,
                         ::testing::Values(AdapterCase{"llama_gqa_llama3rope_bf16", false},
                                           AdapterCase{"qwen2_bias_sharded", false},
                                           AdapterCase{"qwen3_qknorm_headdim", true}),
                         [](const ::testing::TestParamInfo<AdapterCase>& info) {
                           return info.param.variant + (info.param.use_rslora ? "_rslora" : "");
                         });

}  // namespace
}  // namespace kappa::model
