// The whole actor-learner loop as real processes on loopback: `kappa run`
// bootstraps tiny teacher/student checkpoints, starts the teacher, verifier,
// learner and two rollout workers, trains a few steps and shuts down. The
// run directory is then checked: the policy version advances with each step,
// every group was consumed exactly once, and the workers sampled with
// weights newer than version 0.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/integration/run_files.h"
#include "tests/integration/tiny_run_config.h"

namespace {

namespace fs = std::filesystem;
using kappa::testing::ReadAll;

TEST(EndToEndLoopTest, TrainsAFewStepsWithTwoWorkers) {
  const fs::path root = fs::temp_directory_path() / ("kappa-e2e-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path config = root / "e2e.yaml";
  std::ofstream(config) << kappa::testing::TinyRunConfig(
      "e2e", root.string(), 2,
      "{steps: 6, groups_per_step: 3, group_size: 4, eval_every: 3, eval_examples: 20,\n"
      "          checkpoint_every: 3}");
  const std::string command = std::string(KAPPA_CLI) + " run " + config.string() +
                              " --no-progress > " + (root / "kappa.out").string() + " 2>&1";
  const int status = std::system(command.c_str());
  ASSERT_EQ(status, 0) << ReadAll(root / "kappa.out");

  const fs::path run_dir = root / "runs" / "e2e";
  ASSERT_TRUE(fs::exists(run_dir / "config.yaml"));
  std::ifstream metrics(run_dir / "metrics.jsonl");
  std::string line;
  std::set<std::string> leases;
  int64_t consumed = 0;
  int64_t expected_step = 0;
  int64_t newest_sampling_version = -1;
  int64_t mismatch_steps = 0;
  nlohmann::json last;
  while (std::getline(metrics, line)) {
    nlohmann::json record = nlohmann::json::parse(line);
    EXPECT_EQ(record["step"].get<int64_t>(), expected_step);
    EXPECT_EQ(record["policy_version"].get<int64_t>(), expected_step);
    if (expected_step > 0) {
      // fp32 on the CPU: the learner recomputes the workers' log-probs of
      // the tokens they sampled with the current version to float rounding.
      if (record["mismatch_tokens"].get<int64_t>() > 0) {
        ++mismatch_steps;
        EXPECT_LT(record["mismatch_abs_mean"].get<double>(), 1e-3) << line;
        EXPECT_LT(std::abs(record["mismatch_k3"].get<double>()), 1e-5) << line;
      } else {
        EXPECT_TRUE(record["mismatch_abs_mean"].is_null()) << line;
      }
      EXPECT_EQ(record["alarm_active"]["inference_mismatch"], 0) << line;
      for (const auto& id : record["lease_ids"]) {
        EXPECT_TRUE(leases.insert(id.get<std::string>()).second) << "lease consumed twice: " << id;
        ++consumed;
      }
      for (const auto& version : record["group_versions"]) {
        const int64_t v = version.get<int64_t>();
        EXPECT_LE(expected_step - 1 - v, 2) << "group older than max_staleness was trained on";
        newest_sampling_version = std::max(newest_sampling_version, v);
      }
    }
    ++expected_step;
    last = record;
  }
  EXPECT_EQ(expected_step, 7) << "a step-0 evaluation line plus one line per step";
  EXPECT_EQ(consumed, 18);
  EXPECT_EQ(last["groups_consumed"].get<int64_t>(), 18);
  EXPECT_GE(newest_sampling_version, 1) << "workers never sampled with updated weights";
  EXPECT_GE(mismatch_steps, 1) << "no step had on-policy tokens (step 1 always has)";
  EXPECT_TRUE(last.contains("eval_accuracy"));
  EXPECT_TRUE(fs::exists(run_dir / "checkpoints" / "latest"));
  for (const char* log : {"learner.log", "teacher.log", "verifier.log", "rollout-0.log",
                          "rollout-1.log"}) {
    EXPECT_TRUE(fs::exists(run_dir / "logs" / log)) << log;
  }
  // logging.tensorboard (on by default): an independent reader of the event
  // file format finds every metrics.jsonl scalar at its step, and reads a
  // copy cut inside its last record up to the record before.
  const std::string reader = std::string(KAPPA_REFERENCE_PYTHON) + " " + KAPPA_SOURCE_DIR +
                             "/tests/integration/tensorboard_reader.py --check " +
                             run_dir.string() + " > " + (root / "tb.out").string() + " 2>&1";
  EXPECT_EQ(std::system(reader.c_str()), 0) << ReadAll(root / "tb.out");
  fs::remove_all(root);
}

// Bytes of tensor data in a safetensors file: its size less the 8-byte
// header length and the header.
int64_t SafetensorsDataBytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  uint64_t header = 0;
  in.read(reinterpret_cast<char*>(&header), 8);
  return static_cast<int64_t>(fs::file_size(file)) - 8 - static_cast<int64_t>(header);
}

// The data bytes of each "policy version N loaded ... (P parameters, B
// <dtype> bytes[ as a delta]" line of a worker log, in order; `delta` says
// which were deltas.
std::vector<std::pair<int64_t, bool>> LoadedVersionBytes(const std::string& log) {
  std::vector<std::pair<int64_t, bool>> loaded;
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t parameters = line.find(" parameters, ");
    if (line.find("policy version ") == std::string::npos || parameters == std::string::npos) {
      continue;
    }
    loaded.emplace_back(std::stoll(line.substr(parameters + 13)),
                        line.find(" as a delta") != std::string::npos);
  }
  return loaded;
}

// student.lora (issue 41): the learner trains rank-4 adapters on the frozen
// student, checkpoints them in PEFT's layout, and sends the workers the
// frozen weights once and then the adapters alone (gRPC deltas), which they
// apply unmerged: their log-probs match the learner's. A resumed run goes on
// from the adapter checkpoint, now over shared memory.
TEST(EndToEndLoopTest, TrainsLoraAdaptersSyncsOnlyThemAndResumes) {
  const fs::path root = fs::temp_directory_path() / ("kappa-e2e-lora-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path config = root / "lora.yaml";
  std::ofstream(config) << kappa::testing::TinyRunConfig(
      "lora", root.string(), 1,
      "{steps: 4, groups_per_step: 2, group_size: 4, eval_every: 2, eval_examples: 10,\n"
      "          checkpoint_every: 2, lr: 0.01}");
  const std::string run = std::string(KAPPA_CLI) + " run " + config.string() +
                          " student.lora.rank=4 student.lora.alpha=8";
  const std::string command = run + " rollout.weight_transport=grpc --no-progress > " +
                              (root / "kappa.out").string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << ReadAll(root / "kappa.out");

  const fs::path run_dir = root / "runs" / "lora";
  auto check_metrics = [&](int64_t steps) {
    std::ifstream metrics(run_dir / "metrics.jsonl");
    std::string line;
    int64_t measured = 0, last_step = -1;
    while (std::getline(metrics, line)) {
      const nlohmann::json record = nlohmann::json::parse(line);
      last_step = record["step"].get<int64_t>();
      if (last_step == 0) continue;
      if (record["mismatch_tokens"].get<int64_t>() > 0) {
        EXPECT_LT(record["mismatch_abs_mean"].get<double>(), 1e-3) << line;
      }
      measured += record["kappa"].is_number();
    }
    EXPECT_EQ(last_step, steps);
    EXPECT_GE(measured, 1) << "κ was never measured";
  };
  check_metrics(4);

  // The checkpoint is a PEFT adapter directory, without the frozen weights.
  const fs::path checkpoint = run_dir / "checkpoints" / "step-4";
  ASSERT_TRUE(fs::exists(checkpoint / "adapter_config.json")) << ReadAll(root / "kappa.out");
  EXPECT_FALSE(fs::exists(checkpoint / "model.safetensors"));
  const nlohmann::json adapter_config =
      nlohmann::json::parse(ReadAll(checkpoint / "adapter_config.json"));
  EXPECT_EQ(adapter_config["peft_type"], "LORA");
  EXPECT_EQ(adapter_config["r"], 4);
  EXPECT_EQ(adapter_config["lora_alpha"], 8.0);
  EXPECT_TRUE(
      fs::exists(adapter_config["base_model_name_or_path"].get<std::string>() + "/config.json"));

  // The worker got its first version whole, then deltas no larger than the
  // adapters (a version it skipped past its delta base comes whole again).
  const int64_t adapter_bytes = SafetensorsDataBytes(checkpoint / "adapter_model.safetensors");
  const std::vector<std::pair<int64_t, bool>> loaded =
      LoadedVersionBytes(ReadAll(run_dir / "logs" / "rollout-0.log"));
  ASSERT_GE(loaded.size(), 2u);
  EXPECT_FALSE(loaded.front().second);
  int64_t deltas = 0;
  for (const auto& [bytes, delta] : loaded) {
    deltas += delta;
    if (delta) {
      EXPECT_LE(bytes, adapter_bytes);
    } else {
      EXPECT_GT(bytes, 4 * adapter_bytes) << "a whole version carries the frozen weights";
    }
  }
  EXPECT_GE(deltas, 1);

  const std::string resume =
      run + " trainer.steps=6 --resume --no-progress > " + (root / "resume.out").string() + " 2>&1";
  ASSERT_EQ(std::system(resume.c_str()), 0) << ReadAll(root / "resume.out");
  EXPECT_NE(ReadAll(run_dir / "logs" / "learner.log").find("resuming from"), std::string::npos);
  check_metrics(6);
  EXPECT_TRUE(fs::exists(run_dir / "checkpoints" / "step-6" / "adapter_model.safetensors"));

  // student.lora.init: a new run starts from those adapters (as from one
  // trained with PEFT); adapters of another rank are refused before any
  // process starts, naming the key, the file and the field.
  const std::string init = " student.lora.init=" + checkpoint.string();
  const std::string other = std::string(KAPPA_CLI) + " run " + config.string() +
                            " name=lora-init student.lora.alpha=8 trainer.steps=2";
  const std::string refused_command =
      other + " student.lora.rank=2" + init + " > " + (root / "refused.out").string() + " 2>&1";
  EXPECT_NE(std::system(refused_command.c_str()), 0);
  const std::string refused = ReadAll(root / "refused.out");
  EXPECT_NE(refused.find("student.lora.init: " + (checkpoint / "adapter_config.json").string() +
                         ": \"r\" is 4 but student.lora.rank is 2"),
            std::string::npos)
      << refused;
  EXPECT_FALSE(fs::exists(root / "runs" / "lora-init"));
  const std::string started = other + " student.lora.rank=4" + init + " --no-progress > " +
                              (root / "init.out").string() + " 2>&1";
  ASSERT_EQ(std::system(started.c_str()), 0) << ReadAll(root / "init.out");
  EXPECT_NE(ReadAll(root / "runs" / "lora-init" / "logs" / "learner.log")
                .find("LoRA adapters from " + checkpoint.string()),
            std::string::npos);
  fs::remove_all(root);
}

// The final-parameters fingerprint a learner rank logs when it finishes.
std::string Fingerprint(const std::string& log) {
  const size_t at = log.find("final parameters: ");
  if (at == std::string::npos) return "";
  const size_t fingerprint = log.find("fingerprint ", at);
  return log.substr(fingerprint + 12, 16);
}

TEST(EndToEndLoopTest, TwoDataParallelLearnerRanksTrainInLockstep) {
  // learner.world_size=2 through the environment, as a container would set
  // it: `kappa run` starts two learner ranks (Gloo over a TCP store on
  // loopback), worker i talking to rank i mod 2.
  const fs::path root = fs::temp_directory_path() / ("kappa-e2e-dp-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path config = root / "dp.yaml";
  std::ofstream(config) << kappa::testing::TinyRunConfig(
      "dp", root.string(), 2,
      "{steps: 4, groups_per_step: 4, group_size: 4, eval_every: 2, eval_examples: 10,\n"
      "          checkpoint_every: 2}");
  const std::string command = "KAPPA_CFG_LEARNER__WORLD_SIZE=2 " + std::string(KAPPA_CLI) +
                              " run " + config.string() + " --no-progress > " +
                              (root / "kappa.out").string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << ReadAll(root / "kappa.out");

  const fs::path logs = root / "runs" / "dp" / "logs";
  const std::string rank0 = ReadAll(logs / "learner.log");
  const std::string rank1 = ReadAll(logs / "learner-1.log");
  EXPECT_NE(rank0.find("all 2 ranks joined"), std::string::npos) << rank0;
  EXPECT_NE(rank1.find("rank 1 of 2"), std::string::npos) << rank1;
  // Both ranks trained every step and ended with bitwise-equal parameters.
  EXPECT_NE(rank1.find("step 4:"), std::string::npos) << rank1;
  ASSERT_EQ(Fingerprint(rank0).size(), 16u) << rank0;
  EXPECT_EQ(Fingerprint(rank0), Fingerprint(rank1));
  // Only rank 0 logs steps (a step-0 evaluation line plus one per step),
  // each on its half of the batch.
  std::ifstream metrics(root / "runs" / "dp" / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (lines > 0) {
      EXPECT_EQ(record["lease_ids"].size(), 2u) << line;
    }
    ++lines;
  }
  EXPECT_EQ(lines, 5);

  // Every rank checkpointed (rank 1 under rank-1/), so both resume at step 4
  // and go on in lockstep, from here on with AdamW's state and the summed
  // gradients sharded (learner.shard: gradients): each rank takes its half
  // of its unsharded state, reduce-scatters every gradient, steps its half
  // and all-gathers the weights, which stay bitwise equal.
  EXPECT_TRUE(fs::exists(root / "runs" / "dp" / "rank-1" / "checkpoints" / "latest"));
  const std::string sharded = "KAPPA_CFG_LEARNER__SHARD=gradients ";
  const std::string resume = sharded + "KAPPA_CFG_LEARNER__WORLD_SIZE=2 " + std::string(KAPPA_CLI) +
                             " run " + config.string() +
                             " trainer.steps=6 --resume --no-progress > " +
                             (root / "resume.out").string() + " 2>&1";
  ASSERT_EQ(std::system(resume.c_str()), 0) << ReadAll(root / "resume.out");
  const std::string resumed0 = ReadAll(logs / "learner.log");
  const std::string resumed1 = ReadAll(logs / "learner-1.log");
  EXPECT_NE(resumed1.find("step 6:"), std::string::npos) << resumed1;
  EXPECT_NE(resumed1.find("learner.shard: gradients: rank 1 of 2 holds AdamW's state and the "
                          "summed gradients"),
            std::string::npos)
      << resumed1;
  const size_t second_run = resumed0.rfind("final parameters: ");
  ASSERT_NE(second_run, std::string::npos);
  EXPECT_EQ(Fingerprint(resumed0.substr(second_run)),
            Fingerprint(resumed1.substr(resumed1.rfind("final parameters: "))));
  EXPECT_NE(Fingerprint(resumed0.substr(second_run)), Fingerprint(rank0)) << "no step was taken";

  // Rank 1 "died" while the set of step 6 was being written (its trainer
  // state, written last, is missing), and the run resumes as one process:
  // from step 4, the newest step both ranks completed, with the sharded
  // optimizer state and the two ranks' prompts resharded onto one.
  fs::remove(root / "runs" / "dp" / "rank-1" / "checkpoints" / "step-6" / "trainer_state.json");
  const std::string single = std::string(KAPPA_CLI) + " run " + config.string() +
                             " trainer.steps=8 --resume --no-progress > " +
                             (root / "single.out").string() + " 2>&1";
  ASSERT_EQ(std::system(single.c_str()), 0) << ReadAll(root / "single.out");
  const std::string one = ReadAll(logs / "learner.log");
  EXPECT_NE(one.find("the checkpoint of step 6 is not complete on every rank (rank 1"),
            std::string::npos)
      << one;
  EXPECT_NE(one.find("resuming step 4 written by 2 rank(s) as rank 0 of 1"), std::string::npos)
      << one;
  EXPECT_NE(one.find("step 8:"), std::string::npos) << one;
  fs::remove_all(root);
}

TEST(EndToEndLoopTest, AKilledRankEndsTheRunAndTheShardedSetResumesFromItsCheckpoint) {
  // Two sharded learner ranks under `kappa run`; rank 1 is SIGKILLed after
  // step 4 (the step-3 checkpoint written, the step-6 one not begun): the
  // run ends for every rank, and `--resume` restarts the set from step 3,
  // each rank from its own shard, to the end in lockstep.
  const fs::path root =
      fs::temp_directory_path() / ("kappa-e2e-dpkill-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path config = root / "dpkill.yaml";
  std::ofstream(config) << kappa::testing::TinyRunConfig(
      "dpkill", root.string(), 2,
      "{steps: 9, groups_per_step: 4, group_size: 4, eval_every: 100, eval_examples: 10,\n"
      "          checkpoint_every: 3}");
  const std::string env = "KAPPA_CFG_LEARNER__SHARD=optimizer KAPPA_CFG_LEARNER__WORLD_SIZE=2 ";
  const fs::path logs = root / "runs" / "dpkill" / "logs";
  int first_status = -1;
  std::thread run([&] {
    first_status = std::system((env + KAPPA_CLI + " run " + config.string() + " --no-progress > " +
                                (root / "kill.out").string() + " 2>&1")
                                   .c_str());
  });
  pid_t killed = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (killed == 0 && std::chrono::steady_clock::now() < deadline) {
    if (ReadAll(logs / "learner-1.log").find("step 4:") != std::string::npos) {
      killed = kappa::testing::FindProcess("--rank 1 --dist-store");
      if (killed != 0) ::kill(killed, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  run.join();
  ASSERT_NE(killed, 0) << ReadAll(root / "kill.out");
  EXPECT_NE(first_status, 0) << "the run went on without rank 1";
  EXPECT_NE(ReadAll(root / "kill.out").find("kappa run: learner-1 "), std::string::npos)
      << ReadAll(root / "kill.out");
  const std::string rank1 = ReadAll(logs / "learner-1.log");
  EXPECT_EQ(rank1.find("step 9:"), std::string::npos) << rank1;

  ASSERT_EQ(std::system((env + KAPPA_CLI + " run " + config.string() +
                         " --resume --no-progress > " + (root / "resume.out").string() + " 2>&1")
                            .c_str()),
            0)
      << ReadAll(root / "resume.out");
  const std::string rank0 = ReadAll(logs / "learner.log");
  const std::string resumed1 = ReadAll(logs / "learner-1.log");
  // From the step-3 checkpoint (a slow poll that saw step 4 late may have
  // let the ranks write step 6's too): the same step on both ranks.
  const auto resumed_step = [](const std::string& log) {
    std::smatch match;
    return std::regex_search(log, match, std::regex("resuming from \\S+ \\(step ([0-9]+)\\)"))
               ? std::stoi(match[1].str())
               : -1;
  };
  const int from = resumed_step(rank0);
  EXPECT_TRUE(from == 3 || from == 6) << rank0;
  EXPECT_EQ(resumed_step(resumed1), from) << resumed1;
  EXPECT_NE(resumed1.find("step 9:"), std::string::npos) << resumed1;
  const size_t end0 = rank0.rfind("final parameters: ");
  const size_t end1 = resumed1.rfind("final parameters: ");
  ASSERT_NE(end0, std::string::npos);
  ASSERT_NE(end1, std::string::npos);
  EXPECT_EQ(Fingerprint(rank0.substr(end0)), Fingerprint(resumed1.substr(end1)));
  fs::remove_all(root);
}

}  // namespace
