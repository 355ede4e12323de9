// cli/memory_plan.h against recorded real-size numbers: the learner step of
// bench/README.md "Learner step at a real vocabulary" (kappa_bench_vocab_scale:
// Qwen2.5-0.5B width, V = 151,936, κ and K_DR every step, fp32, AdamW), and
// the arithmetic that does not depend on a measurement (parameter counts,
// message sizes, the refusal's wording).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "cli/memory_plan.h"

namespace kappa::cli {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Qwen2.5-0.5B's shape (bench/qwen_shapes.h).
ModelDims Qwen05(int64_t layers) {
  ModelDims d;
  d.vocab = 151936;
  d.hidden = 896;
  d.intermediate = 4864;
  d.layers = layers;
  d.heads = 14;
  d.kv_heads = 2;
  d.head_dim = 64;
  d.max_positions = 32768;
  d.tied = true;
  d.qkv_bias = true;
  return d;
}

TEST(MemoryPlanTest, CountsTheParametersOfRealModels) {
  // bench/README.md: 494.0 M at 24 layers, 195.8 M at 4.
  EXPECT_EQ(Qwen05(24).Parameters(), 494032768);
  EXPECT_NEAR(Qwen05(4).Parameters() / 1e6, 195.8, 0.05);
}

// One vocab-scale bench process: the configuration
// bench/vocab_scale_bench.cc runs (8 rows = 2 groups × G 4, or 4 rows = 1
// group, of 64 prompt + 448 response tokens), as run settings.
PlanInputs VocabScaleBench(int64_t layers, int64_t rows, bool full, int64_t chunk, bool ckpt) {
  PlanInputs in;
  services::Config& c = in.config;
  c.trainer.group_size = 4;
  c.trainer.groups_per_step = rows / 4;
  c.trainer.micro_batch_sequences = 0;
  c.trainer.vocab_chunk_positions = chunk;
  c.trainer.activation_checkpointing = ckpt;
  c.trainer.precision = services::Precision::kFloat32;
  c.trainer.teacher_values = services::Precision::kFloat32;
  c.trainer.distill_topk = 64;
  c.monitor.kappa_every = 1;
  c.rollout.max_new_tokens = 448;
  in.prompt_tokens = 64;
  in.student = Qwen05(layers);
  in.teacher = in.student;
  in.teacher_rows = full ? TeacherRows::kFull : TeacherRows::kTopK;
  return in;
}

// The terms of the learner's plan that the bench process holds (it has no
// service: no snapshots, buffer, evaluation or service base), plus the
// bench binary's empty-process RSS, 152 MiB (bench/README.md "Loading a
// Hugging Face checkpoint"); without AdamW's moments for a one-step run
// (they appear after the first step).
int64_t StepBytes(const PlanInputs& in, bool with_moments) {
  const std::set<std::string> step_terms = {"weights (fp32 master)",
                                            "gradient",
                                            "gradient of L_D apart (kappa, M3)",
                                            "AdamW moments",
                                            "activations",
                                            "vocab head",
                                            "teacher rows (batch)",
                                            "summed gradient segments"};
  const MemoryPlan plan = PlanMemory(in);
  int64_t bytes = 152 * kMiB;
  for (const PlanTerm& term : plan.processes.front().terms) {
    if (step_terms.count(term.name) == 0) continue;
    if (term.name == "AdamW moments" && !with_moments) continue;
    bytes += term.bytes;
  }
  return bytes;
}

// Every configuration that fit in the bench's 20 GiB, 2026-12-01: peak RSS
// in MiB. The plan is within 20 % of each: 0.94–1.12 of the 4-layer ones,
// and 0.86 of the 24-layer step (its measured peak holds more than the
// plan's one recomputed layer).
TEST(MemoryPlanTest, LearnerStepMatchesTheVocabScaleBenchWithinTwentyPercent) {
  struct Case {
    int64_t layers, rows;
    bool full;
    int64_t chunk;
    bool ckpt;
    bool moments;
    double measured_mib;
  };
  const Case cases[] = {
      {4, 8, true, 512, false, true, 15120},   {4, 8, true, 512, true, true, 12679},
      {4, 8, false, 512, false, true, 9104},   {4, 8, false, 512, true, true, 6847},
      {4, 4, true, 0, false, true, 13885},     {4, 4, true, 0, true, true, 12626},
      {4, 4, true, 512, false, true, 10520},   {4, 4, true, 512, true, true, 9328},
      {4, 4, false, 0, false, true, 13809},    {4, 4, false, 0, true, true, 12608},
      {4, 4, false, 512, false, true, 7776},   {4, 4, false, 512, true, true, 6795},
      {24, 8, false, 512, true, false, 10705},
  };
  // Measured with the head that recomputes each chunk (before the fused
  // head existed); the fused head's own rows below.
  for (const Case& c : cases) {
    PlanInputs in = VocabScaleBench(c.layers, c.rows, c.full, c.chunk, c.ckpt);
    in.config.trainer.fused_head = false;
    const double planned = StepBytes(in, c.moments) / static_cast<double>(kMiB);
    const double ratio = planned / c.measured_mib;
    SCOPED_TRACE(testing::Message()
                 << c.layers << " layers, " << c.rows << " rows, " << (c.full ? "full" : "topk")
                 << ", chunk " << c.chunk << ", ckpt " << c.ckpt << ": planned " << planned
                 << " MiB, measured " << c.measured_mib << " MiB");
    std::cout << c.layers << " layers " << c.rows << " rows " << (c.full ? "full" : "topk")
              << " chunk " << c.chunk << " ckpt " << c.ckpt << ": planned " << planned
              << " MiB, measured " << c.measured_mib << " MiB, ratio " << ratio << "\n";
    EXPECT_GT(ratio, 0.8);
    EXPECT_LT(ratio, 1.2);
  }
  // The fused head, a position at a time on the CPU (bench/README.md "Like
  // for like against eager PyTorch", 2026-12-07, 4ce5191: top-64 rows,
  // 4 layers, 4 rows, chunks of 256, with and without checkpointing).
  for (const auto& [ckpt, measured_mib] : {std::pair{true, 4459.0}, std::pair{false, 5372.0}}) {
    PlanInputs in = VocabScaleBench(4, 4, /*full=*/false, 256, ckpt);
    in.config.monitor.kappa_every = 0;  // the plain step the comparison times
    const double ratio = StepBytes(in, true) / static_cast<double>(kMiB) / measured_mib;
    std::cout << "fused head, ckpt " << ckpt << ": ratio " << ratio << "\n";
    EXPECT_GT(ratio, 0.8) << "ckpt " << ckpt;
    EXPECT_LT(ratio, 1.2) << "ckpt " << ckpt;
  }
  // The unchunked 8-row runs failed an allocation under `ulimit -v` 20 GiB
  // with this much resident: the plan needs more than that.
  EXPECT_GT(StepBytes(VocabScaleBench(4, 8, false, 0, false), true), 17838 * kMiB);
  EXPECT_GT(StepBytes(VocabScaleBench(4, 8, false, 0, true), true), 18600 * kMiB);
}

TEST(MemoryPlanTest, FullTeacherRowsAtARealVocabularyExceedTheDefaultMessageLimit) {
  PlanInputs in = VocabScaleBench(24, 8, /*full=*/true, 512, true);
  in.config.rollout.max_new_tokens = 64;
  const MemoryPlan plan = PlanMemory(in);
  // G 4 × T 64 × V 151,936 × 4 B = 155.6 MB: F4 of the issue-38 survey.
  ASSERT_EQ(plan.messages.front().name, "ScoredGroup");
  EXPECT_GE(plan.messages.front().bytes, 4 * 64 * int64_t{151936} * 4);
  EXPECT_LT(plan.messages.front().bytes, 4 * 64 * int64_t{151936} * 4 + 64 * 1024);
  const absl::Status fits = CheckPlanFits(plan, in.config, {});
  EXPECT_EQ(fits.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fits.message().find("security.max_message_bytes"), std::string::npos) << fits;

  // Top-64 bf16 rows: 388 B per token on the wire.
  in.teacher_rows = TeacherRows::kTopK;
  in.config.trainer.teacher_values = services::Precision::kBFloat16;
  EXPECT_LT(PlanMemory(in).messages.front().bytes, 4 * 64 * 420 + 4096);
  EXPECT_TRUE(CheckPlanFits(PlanMemory(in), in.config, {}).ok());
}

// teacher.rows: hidden (issue 53): the learner holds the teacher's head and
// each chunk's teacher logits; the wire and the batch carry D_t values a
// position, and the ScoredGroup shrinks by V / D_t against full rows.
TEST(MemoryPlanTest, HiddenTeacherRowsCountTheHeadOnTheLearnerAndDtValuesInFlight) {
  PlanInputs in = VocabScaleBench(4, 8, /*full=*/true, 512, false);
  in.teacher.hidden = 1536;  // a 1.5B teacher's width over the same vocabulary
  const int64_t full_group = PlanMemory(in).messages.front().bytes;
  in.teacher_rows = TeacherRows::kHidden;
  const MemoryPlan plan = PlanMemory(in);
  const PlanTerm* head = nullptr;
  for (const PlanTerm& term : plan.processes.front().terms) {
    if (term.name == "teacher head (teacher.rows: hidden)") head = &term;
  }
  ASSERT_NE(head, nullptr);
  // V·D_t·4 (float32 on the CPU) + one chunk's [c, V] teacher logits (the
  // fused head normalises them a position at a time).
  EXPECT_EQ(head->bytes, int64_t{151936} * 1536 * 4 + 512 * int64_t{151936} * 4);
  EXPECT_EQ(head->key, "teacher.rows");
  ASSERT_EQ(plan.messages.front().name, "ScoredGroup");
  // G 4 × T 448 × D_t 1,536 × 4 B of hidden values, plus the per-token rest.
  EXPECT_LT(plan.messages.front().bytes, 4 * 448 * (1536 * 4 + 64) + 64 * 1024);
  EXPECT_LT(plan.messages.front().bytes * 50, full_group);
}

TEST(MemoryPlanTest, ARefusalNamesTheProcessTheTermAndItsKey) {
  PlanInputs in = VocabScaleBench(24, 8, /*full=*/false, /*chunk=*/0, /*ckpt=*/true);
  const MemoryPlan plan = PlanMemory(in);
  const int64_t total = plan.DeviceBytes("host");
  EXPECT_TRUE(CheckPlanFits(plan, in.config, {{"host", total * 2}}).ok());
  const absl::Status refused = CheckPlanFits(plan, in.config, {{"host", total}});
  ASSERT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(refused.message());
  EXPECT_EQ(message.rfind("learner needs ", 0), 0u) << message;
  EXPECT_NE(message.find("'vocab head'"), std::string::npos) << message;
  EXPECT_NE(message.find("trainer.vocab_chunk_positions=0; try 1024"), std::string::npos)
      << message;
  // A device without a known capacity is not checked.
  EXPECT_TRUE(CheckPlanFits(plan, in.config, {{"cuda:0", 1}}).ok());
}

// Shared-memory weight sync keeps three versions in /dev/shm (the latest
// two and the file prepared for the next, learner/shm_policy.h): host
// memory the plan charges to the learner, in the wire dtype.
TEST(MemoryPlanTest, SharedMemoryTransportCountsThreeVersionsOfDevShm) {
  PlanInputs in = VocabScaleBench(24, 8, /*full=*/false, 512, true);
  in.wire_bytes = 2;
  auto shm_bytes = [](const MemoryPlan& plan) {
    int64_t bytes = 0;
    for (const PlanTerm& term : plan.processes.front().terms) {
      if (term.name == "/dev/shm segments") bytes += term.bytes;
    }
    return bytes;
  };
  EXPECT_EQ(shm_bytes(PlanMemory(in)), 0);  // grpc, the default
  for (const char* transport : {"shm", "auto"}) {
    in.config.rollout.weight_transport =
        *services::ChoiceNamed<services::WeightTransport>(transport);
    EXPECT_EQ(shm_bytes(PlanMemory(in)), 3 * Qwen05(24).Parameters() * 2) << transport;
  }
}

// student.lora at Qwen2.5-0.5B: rank 16 on all seven projections.
constexpr int64_t kRank = 16;

// N_a by hand from the published shape (hidden 896, intermediate 4864, 14
// heads and 2 KV heads of 64, 24 layers), r·(in + out) per projection:
//   q_proj [896, 896]   16·(896 + 896)  = 28,672
//   k_proj [128, 896]   16·(896 + 128)  = 16,384
//   v_proj [128, 896]   16·(896 + 128)  = 16,384
//   o_proj [896, 896]   16·(896 + 896)  = 28,672
//   gate_proj [4864, 896] 16·(896 + 4864) = 92,160
//   up_proj [4864, 896]   16·(896 + 4864) = 92,160
//   down_proj [896, 4864] 16·(4864 + 896) = 92,160
// 366,592 per layer × 24 = 8,798,208 (PEFT's print_trainable_parameters
// for this model and LoraConfig says the same).
constexpr int64_t kQwen05AdaptersRank16 =
    24 * (16 * (896 + 896) + 2 * 16 * (896 + 128) + 16 * (896 + 896) + 3 * 16 * (896 + 4864));
static_assert(kQwen05AdaptersRank16 == 8798208);

// The vocab-scale bench's learner under bf16 autocast as a `kappa run` of
// two gRPC workers (bf16 snapshots, wire and worker weights), with
// student.lora at `rank`.
PlanInputs QwenRun(int64_t rank) {
  PlanInputs in = VocabScaleBench(24, 8, /*full=*/false, 512, /*ckpt=*/true);
  in.config.trainer.precision = services::Precision::kBFloat16;
  in.config.workers = 2;
  in.worker_weight_bytes = 2;
  in.snapshot_bytes = 2;
  in.wire_bytes = 2;
  in.config.student.lora.rank = rank;
  return in;
}

// The learner's term `name`, or nullptr.
const PlanTerm* LearnerTerm(const MemoryPlan& plan, const std::string& name) {
  for (const PlanTerm& term : plan.processes.front().terms) {
    if (term.name == name) return &term;
  }
  return nullptr;
}

TEST(MemoryPlanLoraTest, CountsTheAdaptersOfEveryTargetedProjection) {
  services::Config::Student::Lora lora;
  lora.rank = kRank;  // the default targets: all seven
  EXPECT_EQ(Qwen05(24).AdapterParameters(lora), kQwen05AdaptersRank16);
  // q_proj and v_proj only: 24·(28,672 + 16,384).
  lora.target_modules = {"q_proj", "v_proj"};
  EXPECT_EQ(Qwen05(24).AdapterParameters(lora), 24 * (28672 + 16384));
  lora.rank = 0;
  EXPECT_EQ(Qwen05(24).AdapterParameters(lora), 0);
}

TEST(MemoryPlanLoraTest, TheOptimizerAndTheSnapshotsHoldTheAdaptersOnly) {
  const int64_t n = Qwen05(24).Parameters();
  const int64_t adapters = kQwen05AdaptersRank16;
  const MemoryPlan plan = PlanMemory(QwenRun(kRank));
  const auto bytes = [&](const std::string& name) -> int64_t {
    const PlanTerm* term = LearnerTerm(plan, name);
    return term == nullptr ? -1 : term->bytes;
  };
  EXPECT_EQ(bytes("weights (fp32 master)"), -1);
  EXPECT_EQ(bytes("frozen weights (fp32)"), 4 * n);
  EXPECT_EQ(bytes("adapters (fp32 master)"), 4 * adapters);
  EXPECT_EQ(bytes("gradient"), 4 * adapters);
  EXPECT_EQ(bytes("gradient of L_D apart (kappa, M3)"), 4 * adapters);  // κ every step
  EXPECT_EQ(bytes("AdamW moments"), 8 * adapters);
  ASSERT_NE(LearnerTerm(plan, "AdamW moments"), nullptr);
  EXPECT_EQ(LearnerTerm(plan, "AdamW moments")->formula, "8·N_a (adapters only, student.lora)");
  // The frozen weights once in bf16; the adapters of three versions (the
  // delta base is kept whenever LoRA is on); XOR data of the adapters.
  EXPECT_EQ(bytes("policy snapshot of the frozen weights"), n * 2);
  EXPECT_EQ(bytes("policy snapshots"), 3 * adapters * 2);
  EXPECT_EQ(bytes("wire encodings"), adapters * 2);
  // A worker's two copies carry their adapters in bf16 beside the weights.
  for (const PlanTerm& term : plan.processes[1].terms) {
    if (term.name == "policy copies") EXPECT_EQ(term.bytes, 2 * (n + adapters) * 2);
  }
  // A float32 snapshot on a bf16 wire: the frozen weights are converted
  // once, the adapters of every kept version.
  PlanInputs mixed = QwenRun(kRank);
  mixed.snapshot_bytes = 4;
  const MemoryPlan mixed_plan = PlanMemory(mixed);
  ASSERT_NE(LearnerTerm(mixed_plan, "wire encodings"), nullptr);
  EXPECT_EQ(LearnerTerm(mixed_plan, "wire encodings")->bytes,
            (n + 3 * adapters) * 2 + adapters * 2);
}

TEST(MemoryPlanLoraTest, AVersionCarriesTheAdaptersOnEachWatchPolicyStream) {
  const int64_t n = Qwen05(24).Parameters();
  const int64_t adapters = kQwen05AdaptersRank16;
  PlanInputs in = QwenRun(kRank);
  MemoryPlan plan = PlanMemory(in);
  // N_a·2 bytes × 2 streams, the frozen weights once per worker.
  EXPECT_EQ(plan.sync_bytes_per_version, adapters * 2 * 2);
  EXPECT_NE(plan.sync_formula.find("N_a·2 = 16.8 MiB × 2 WatchPolicy streams"), std::string::npos)
      << plan.sync_formula;
  EXPECT_NE(plan.sync_formula.find("once per worker"), std::string::npos) << plan.sync_formula;

  // Shared memory sends every weight per version, as without LoRA.
  in.config.rollout.weight_transport = services::WeightTransport::kShm;
  EXPECT_EQ(PlanMemory(in).sync_bytes_per_version, (n + adapters) * 2 * 2);
  // The c10d group gets every weight, the other worker's stream the adapters.
  in.config.rollout.weight_transport = services::WeightTransport::kC10d;
  in.config.learner.weight_group_workers = 1;
  EXPECT_EQ(PlanMemory(in).sync_bytes_per_version, adapters * 2 + (n + adapters) * 2);
}

// learner.shard: optimizer splits the moments over the ranks, and a plan
// that does not fit names the key that would shrink them.
TEST(MemoryPlanTest, ShardedOptimizerStateIsEachRanksShare) {
  const int64_t n = Qwen05(24).Parameters();
  PlanInputs in = QwenRun(0);
  in.config.learner.world_size = 2;
  in.config.trainer.groups_per_step = 8;
  const PlanTerm* whole = LearnerTerm(PlanMemory(in), "AdamW moments");
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(whole->bytes, 8 * n);
  EXPECT_EQ(whole->key, "learner.shard");
  in.config.learner.shard = services::LearnerShard::kOptimizer;
  const MemoryPlan plan = PlanMemory(in);
  int ranks = 0;
  for (const ProcessPlan& process : plan.processes) {
    for (const PlanTerm& term : process.terms) {
      if (term.name != "AdamW moments") continue;
      ++ranks;
      EXPECT_EQ(term.bytes, 8 * ((n + 1) / 2)) << process.name;
      EXPECT_EQ(term.key, "learner.world_size");
      EXPECT_NE(term.formula.find("8·⌈N / R⌉"), std::string::npos) << term.formula;
    }
  }
  EXPECT_EQ(ranks, 2);

  // Against bench/sharded_memory.sh's ranks: 24 layers, 2 rows per rank,
  // top-64, chunks of 256, checkpointing, the larger peak RSS of each pair's
  // two ranks within a quarter either way. The plain step (bench/README.md
  // "Sharding the optimizer state", 2026-12-07): 8,922 MiB unsharded (the
  // other rank 9,020), 7,093 under learner.shard: optimizer. κ measured
  // every step (SHARDED_KAPPA=1, "Sharding the gradients", 2026-12-08):
  // 11,488 unsharded, 9,676 under optimizer, 8,565 under gradients (∇L_D's
  // buffer replaced by this rank's half of ∇L_R's sum; ∇L_D's half is the
  // backward buffer's own).
  struct Measured {
    services::LearnerShard shard;
    int64_t kappa_every;
    double peak_mib;
  };
  for (const Measured& measured : {Measured{services::LearnerShard::kNone, 0, 8922.0},
                                   Measured{services::LearnerShard::kOptimizer, 0, 7093.0},
                                   Measured{services::LearnerShard::kNone, 1, 11488.0},
                                   Measured{services::LearnerShard::kOptimizer, 1, 9676.0},
                                   Measured{services::LearnerShard::kGradients, 1, 8565.0}}) {
    PlanInputs bench = VocabScaleBench(24, 8, /*full=*/false, 256, /*ckpt=*/true);
    bench.config.trainer.group_size = 2;
    bench.config.trainer.groups_per_step = 2;  // 2 rows on each of 2 ranks
    bench.config.learner.world_size = 2;
    bench.config.learner.shard = measured.shard;
    bench.config.monitor.kappa_every = measured.kappa_every;
    const double ratio = StepBytes(bench, true) / static_cast<double>(kMiB) / measured.peak_mib;
    std::cout << "shard " << static_cast<int>(measured.shard) << ", kappa_every "
              << measured.kappa_every << ": planned/measured " << ratio << "\n";
    EXPECT_GT(ratio, 0.75);
    EXPECT_LT(ratio, 1.25);
  }
}

// A learner rank that does not fit: the refusal names learner.shard while
// the ranks hold the whole state (here AdamW's moments are its largest
// keyed term too), and learner.world_size once they shard it.
TEST(MemoryPlanTest, ARankThatDoesNotFitNamesTheShardingKeys) {
  PlanInputs in = VocabScaleBench(24, 8, /*full=*/false, 256, /*ckpt=*/true);
  in.config.trainer.groups_per_step = 4;
  in.config.learner.world_size = 2;
  in.config.monitor.kappa_every = 0;
  in.config.rollout.weights_dtype = services::ModelDtype::kBFloat16;
  for (const auto& [shard, expected] :
       {std::pair{services::LearnerShard::kNone,
                  "'AdamW moments' 3.68 GiB (learner.shard=none; try optimizer or gradients); "
                  "or split the learner's state over ranks"},
        std::pair{services::LearnerShard::kGradients,
                  "; or more ranks for smaller shares (learner.world_size=2, "
                  "learner.shard=gradients now)"}}) {
    in.config.learner.shard = shard;
    const MemoryPlan plan = PlanMemory(in);
    const absl::Status refused =
        CheckPlanFits(plan, in.config, {{"host", plan.DeviceBytes("host")}});
    ASSERT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.message().find(expected), std::string::npos) << refused.message();
  }
}

// learner.shard: gradients keeps this rank's segment of each signal's sum
// but the step's last (the backward buffer's own with one micro-batch).
TEST(MemoryPlanTest, ShardedGradientsAreEachRanksSegments) {
  const int64_t n = Qwen05(24).Parameters();
  PlanInputs in = QwenRun(0);
  in.config.learner.world_size = 2;
  in.config.trainer.groups_per_step = 8;
  in.config.learner.shard = services::LearnerShard::kGradients;
  in.config.monitor.kappa_every = 1;
  const MemoryPlan plan = PlanMemory(in);
  const PlanTerm* segments = LearnerTerm(plan, "summed gradient segments");
  ASSERT_NE(segments, nullptr);
  EXPECT_EQ(LearnerTerm(plan, "gradient of L_D apart (kappa, M3)"), nullptr);
  EXPECT_EQ(LearnerTerm(plan, "AdamW moments")->bytes, 8 * ((n + 1) / 2));
  EXPECT_EQ(segments->key, "learner.world_size");
  // One micro-batch: ∇L_R's segment only; more: ∇L_D's too.
  const bool one_round = in.config.trainer.micro_batch_sequences == 0 ||
                         in.config.trainer.micro_batch_sequences >=
                             in.config.trainer.groups_per_step / 2 * in.config.trainer.group_size;
  EXPECT_EQ(segments->bytes, (one_round ? 1 : 2) * 4 * ((n + 1) / 2)) << segments->formula;
  in.config.trainer.micro_batch_sequences = 1;
  EXPECT_EQ(LearnerTerm(PlanMemory(in), "summed gradient segments")->bytes, 2 * 4 * ((n + 1) / 2));
}

// Rank 0 (the default) is full training: the plan of every process is what
// it was before student.lora existed, whatever the other lora keys say.
TEST(MemoryPlanLoraTest, RankZeroPlansFullTrainingUnchanged) {
  const int64_t n = Qwen05(24).Parameters();
  PlanInputs in = QwenRun(0);
  in.config.student.lora.target_modules = {"q_proj"};
  in.config.student.lora.alpha = 64;
  const MemoryPlan plan = PlanMemory(in);
  const MemoryPlan defaults = PlanMemory(QwenRun(0));
  ASSERT_EQ(plan.processes.size(), defaults.processes.size());
  for (size_t p = 0; p < plan.processes.size(); ++p) {
    ASSERT_EQ(plan.processes[p].terms.size(), defaults.processes[p].terms.size());
    for (size_t t = 0; t < plan.processes[p].terms.size(); ++t) {
      EXPECT_EQ(plan.processes[p].terms[t].bytes, defaults.processes[p].terms[t].bytes);
      EXPECT_EQ(plan.processes[p].terms[t].formula, defaults.processes[p].terms[t].formula);
    }
  }
  const auto bytes = [&](const std::string& name) -> int64_t {
    const PlanTerm* term = LearnerTerm(plan, name);
    return term == nullptr ? -1 : term->bytes;
  };
  EXPECT_EQ(bytes("weights (fp32 master)"), 4 * n);
  EXPECT_EQ(bytes("gradient"), 4 * n);
  EXPECT_EQ(bytes("AdamW moments"), 8 * n);
  EXPECT_EQ(bytes("frozen weights (fp32)"), -1);
  EXPECT_EQ(bytes("policy snapshots"), 2 * n * 2);  // no delta base kept
  EXPECT_EQ(bytes("wire encodings"), -1);
  EXPECT_EQ(plan.sync_bytes_per_version, n * 2 * 2);
  EXPECT_EQ(plan.sync_formula, "N·2 = 942.3 MiB × 2 WatchPolicy streams");
  // What training does not change is the same under LoRA.
  const MemoryPlan lora = PlanMemory(QwenRun(kRank));
  for (const char* name :
       {"bf16 weight casts (autocast)", "activations", "scored groups buffered"}) {
    const PlanTerm* term = LearnerTerm(lora, name);
    ASSERT_NE(term, nullptr) << name;
    EXPECT_EQ(term->bytes, bytes(name)) << name;
  }
  // The chunked head makes no gradient of the frozen [V, d] output weight,
  // where full training's fused head holds two (κ measured: each loss's).
  const ModelDims qwen = Qwen05(24);
  ASSERT_NE(LearnerTerm(lora, "vocab head"), nullptr);
  EXPECT_EQ(LearnerTerm(lora, "vocab head")->bytes,
            bytes("vocab head") - 2 * 4 * qwen.vocab * qwen.hidden);
}

}  // namespace
}  // namespace kappa::cli
