#include "model/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "tests/model/test_models.h"

namespace kappa::model {
namespace {

namespace fs = std::filesystem;
using testing::TinyDecoder;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kappa_model_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  std::string ReadBytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void WriteBytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  // A file with the given JSON header and `data_bytes` zero bytes of data.
  std::string MakeFile(const std::string& name, const std::string& header, size_t data_bytes) {
    std::string bytes(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(bytes.data(), &n, 8);
    bytes += header;
    bytes.append(data_bytes, '\0');
    WriteBytes(Path(name), bytes);
    return Path(name);
  }
  void ExpectRejected(const std::string& path, const std::string& fragment) {
    try {
      ReadSafetensors(path);
      ADD_FAILURE() << "accepted " << path;
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

TEST_F(CheckpointTest, SafetensorsRoundTripEveryDtype) {
  torch::manual_seed(1);
  std::map<std::string, torch::Tensor> tensors = {
      {"f32", torch::randn({3, 5})},
      {"bf16", torch::randn({4, 2}).to(torch::kBFloat16)},
      {"f16", torch::randn({7}).to(torch::kFloat16)},
      {"i32", torch::randint(-1000, 1000, {2, 2, 2}, torch::kInt32)},
      {"i64", torch::tensor({int64_t{1} << 40, int64_t{-3}, int64_t{0}})},
      {"scalar", torch::tensor(2.5f)},
      {"empty", torch::zeros({0, 4})},
      {"strided", torch::randn({6, 4}).t()},  // non-contiguous source
  };
  WriteSafetensors(Path("t.safetensors"), tensors);
  const auto bytes = ReadBytes(Path("t.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);  // data section aligned
  const auto back = ReadSafetensors(Path("t.safetensors"));
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_EQ(back.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.at(name).sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(back.at(name), t)) << name;
  }
  EXPECT_THROW(WriteSafetensors(Path("bad.safetensors"), {{"d", torch::zeros({2}, torch::kDouble)}}),
               std::runtime_error);
}

TEST_F(CheckpointTest, SafetensorsRejectsCorruptFiles) {
  WriteSafetensors(Path("good.safetensors"),
                   {{"a", torch::randn({4, 4})}, {"b", torch::arange(6, torch::kLong)}});
  const std::string good = ReadBytes(Path("good.safetensors"));

  WriteBytes(Path("truncated.safetensors"), good.substr(0, good.size() - 5));
  ExpectRejected(Path("truncated.safetensors"), "outside");

  WriteBytes(Path("short.safetensors"), good.substr(0, 5));
  ExpectRejected(Path("short.safetensors"), "too short");

  std::string huge = good;
  const uint64_t big = good.size();  // header length beyond the end of the file
  std::memcpy(huge.data(), &big, 8);
  WriteBytes(Path("huge.safetensors"), huge);
  ExpectRejected(Path("huge.safetensors"), "exceeds the file size");

  std::string garbled = good;
  garbled[9] = '#';
  WriteBytes(Path("garbled.safetensors"), garbled);
  ExpectRejected(Path("garbled.safetensors"), "not valid JSON");

  ExpectRejected(MakeFile("dtype.safetensors",
                          R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8),
                 "unsupported dtype \"F64\"");
  ExpectRejected(MakeFile("count.safetensors",
                          R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                 "tensor \"x\" has 8 bytes");
  ExpectRejected(MakeFile("neg.safetensors",
                          R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
                 "non-negative");
  ExpectRejected(MakeFile("order.safetensors",
                          R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4),
                 "outside");
  ExpectRejected(MakeFile("overlap.safetensors",
                          R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                              "y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                 "overlap");
  ExpectRejected(MakeFile("array.safetensors", "[1,2]", 0), "not a JSON object");
  ExpectRejected(MakeFile("fields.safetensors", R"({"x":{"dtype":"F32"}})", 0), "data_offsets");

  EXPECT_THROW(ReadSafetensors(Path("missing.safetensors")), std::runtime_error);
}

TEST_F(CheckpointTest, SaveLoadGivesIdenticalLogits) {
  for (bool tied : {false, true}) {
    Decoder model = TinyDecoder(2, tied);
    const std::string dir = Path(tied ? "tied" : "untied");
    EXPECT_FALSE(CheckpointExists(dir));
    SaveCheckpoint(dir, model);
    EXPECT_TRUE(CheckpointExists(dir));

    const auto weights = ReadSafetensors(dir + "/model.safetensors");
    EXPECT_TRUE(weights.count("model.embed_tokens.weight"));
    EXPECT_TRUE(weights.count("model.layers.1.self_attn.o_proj.weight"));
    EXPECT_TRUE(weights.count("model.layers.0.mlp.gate_proj.weight"));
    EXPECT_TRUE(weights.count("model.norm.weight"));
    EXPECT_EQ(weights.count("lm_head.weight"), tied ? 0u : 1u);

    Decoder loaded = LoadCheckpoint(dir);
    EXPECT_EQ(loaded->config().num_key_value_heads, 2);
    EXPECT_EQ(loaded->config().tie_word_embeddings, tied);
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(3, 21, {2, 9}, torch::kLong);
    EXPECT_TRUE(torch::equal(model->Forward(tokens).logits, loaded->Forward(tokens).logits));
  }
}

TEST_F(CheckpointTest, SaveReplacesExistingCheckpointAtomically) {
  const std::string dir = Path("ckpt");
  Decoder first = TinyDecoder(4, false, 1);
  Decoder second = TinyDecoder(4, false, 2);
  SaveCheckpoint(dir, first);
  SaveCheckpoint(dir + "/", second);  // replaces; trailing slash tolerated
  Decoder loaded = LoadCheckpoint(dir);
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(3, 21, {1, 5}, torch::kLong);
  EXPECT_TRUE(torch::equal(second->Forward(tokens).logits, loaded->Forward(tokens).logits));
  EXPECT_FALSE(torch::equal(first->Forward(tokens).logits, loaded->Forward(tokens).logits));
  // Nothing but the checkpoint is left behind.
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    ++entries;
    EXPECT_EQ(entry.path().filename(), "ckpt");
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(CheckpointTest, LoadWeightsReportsMissingUnexpectedAndShape) {
  Decoder model = TinyDecoder();
  auto weights = NamedWeights(model);
  std::map<std::string, torch::Tensor> copy;
  for (const auto& [k, v] : weights) copy[k] = v.detach().clone();

  auto expect_error = [&](std::map<std::string, torch::Tensor> w, const std::string& fragment) {
    try {
      LoadWeights(model, w);
      ADD_FAILURE() << "accepted weights (" << fragment << ")";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  auto missing = copy;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  expect_error(missing, "missing [model.layers.1.mlp.up_proj.weight]");
  auto unexpected = copy;
  unexpected["model.layers.9.mlp.up_proj.weight"] = torch::zeros({1});
  expect_error(unexpected, "unexpected [model.layers.9.mlp.up_proj.weight]");
  auto wrong_shape = copy;
  wrong_shape["model.norm.weight"] = torch::ones({5});
  expect_error(wrong_shape, "model.norm.weight (expected [32], got [5])");

  // A rejected load leaves the model untouched; a good one copies values
  // (converting dtype) into the existing parameters.
  EXPECT_TRUE(torch::equal(NamedWeights(model)["model.norm.weight"], torch::ones({32})));
  auto bf16 = copy;
  bf16["model.norm.weight"] = torch::full({32}, 0.5).to(torch::kBFloat16);
  LoadWeights(model, bf16);
  EXPECT_TRUE(torch::equal(NamedWeights(model)["model.norm.weight"], torch::full({32}, 0.5)));
  EXPECT_EQ(NamedWeights(model)["model.norm.weight"].scalar_type(), torch::kFloat32);
}

TEST_F(CheckpointTest, LoadCheckpointNamesTheBrokenFile) {
  Decoder model = TinyDecoder();
  const std::string dir = Path("ckpt");
  SaveCheckpoint(dir, model);
  WriteBytes(dir + "/config.json", "{\"hidden_size\": 32}");
  try {
    LoadCheckpoint(dir);
    ADD_FAILURE() << "loaded a checkpoint with a broken config";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(LoadCheckpoint(Path("nowhere")), std::runtime_error);
}

}  // namespace
}  // namespace kappa::model
