// `kappa plan`'s arithmetic: the memory each process of a run will need,
// term by term, from the run configuration and the two models' shapes; the
// weight-sync bytes per policy version; the size of the largest gRPC
// messages against security.max_message_bytes; and whether every device
// fits. Pure arithmetic: no files, no libtorch, no processes (plan_command.h
// gathers the inputs and the capacities).
//
// With student.lora (rank > 0) the learner trains the adapters only: its
// gradients and AdamW's moments are over N_a = ModelDims::AdapterParameters
// instead of N, the frozen weights are snapshot once for every version, and
// a gRPC WatchPolicy stream carries N_a·wire per version after a worker's
// first full one (learner/policy_publisher.h's deltas; shared memory and
// the c10d group still carry every weight).
//
// Every term is an upper estimate of what the code allocates at the peak
// the term names (the file:line it follows is beside its formula in
// memory_plan.cc), charged to the device it lives on ("host" or "cuda:N").
// The process base terms are measured resident sizes of the binaries with a
// negligible model (memory_plan.cc, kBase*). tests/integration/
// cli_plan_test.cc checks the totals against the peak RSS each process logs
// at exit (services/logging.h), within 25 %.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/config.h"

namespace kappa::cli {

// The sizes of a decoder that the memory depends on (model::ModelConfig's).
struct ModelDims {
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_positions = 0;
  bool tied = false;      // lm_head shares the embedding
  bool qkv_bias = false;  // Qwen2
  bool o_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;  // Qwen3

  // Every parameter (model::Decoder's registered ones, the tied head once).
  int64_t Parameters() const;
  // Parameters of the LoRA adapters student.lora attaches (model/lora.h):
  // A [r, in] and B [out, r] on each projection `lora.target_modules` names,
  // in every layer, so r·(in + out) each, with q_proj [h·hd, d], k_proj and
  // v_proj [kv·hd, d], o_proj [d, h·hd], gate_proj and up_proj [f, d],
  // down_proj [d, f] as [out, in]. 0 when lora.rank <= 0 (full training).
  // Other names count nothing (learner/student_lora.h refuses them).
  int64_t AdapterParameters(const services::Config::Student::Lora& lora) const;
  // The largest single parameter: the [V, d] embedding.
  int64_t LargestParameter() const { return vocab * hidden; }
  // Keys and values of one token over every layer, at `element` bytes.
  int64_t KvBytesPerToken(int64_t element) const {
    return 2 * layers * kv_heads * head_dim * element;
  }
};

// Which teacher rows travel (learner/work_config.cc TeacherFormFor).
enum class TeacherRows { kNone, kFull, kTopK, kSampled, kHidden };

struct PlanInputs {
  services::Config config;
  ModelDims student;
  ModelDims teacher;
  TeacherRows teacher_rows = TeacherRows::kNone;
  int64_t prompt_tokens = 0;     // the longest rendered prompt, P
  int64_t heldout_examples = 0;  // size of the held-out split
  // Element bytes of each model copy, resolved for its process's device
  // (student.dtype on rollout.device, teacher.dtype on teacher.device).
  int64_t worker_weight_bytes = 4;
  int64_t teacher_weight_bytes = 4;
  // The learner's policy snapshot and the wire (rollout.weights_dtype
  // resolved as the workers ask for it): 4 (float32) or 2 (bfloat16).
  int64_t snapshot_bytes = 4;
  int64_t wire_bytes = 4;
};

struct PlanTerm {
  std::string name;    // "weights (fp32 master)", "vocab head", ...
  std::string device;  // "host" or "cuda:N"
  int64_t bytes = 0;
  std::string key;      // the config key that changes it ("" when none does)
  std::string formula;  // how bytes was computed, in the config's terms
};

struct ProcessPlan {
  std::string name;    // "learner", "rollout-0", "teacher", "verifier"
  std::string device;  // where its model runs
  std::vector<PlanTerm> terms;

  int64_t Bytes() const;                           // every term
  int64_t Bytes(const std::string& device) const;  // the terms on `device`
};

struct MessagePlan {
  std::string name;  // "ScoredGroup", "ScoreResponse"
  int64_t bytes = 0;
  int64_t limit = 0;  // security.max_message_bytes
  std::string formula;
};

struct MemoryPlan {
  std::vector<ProcessPlan> processes;
  // Learner → every worker, per version (with student.lora: after each
  // worker's first full version, which sync_formula states).
  int64_t sync_bytes_per_version = 0;
  std::string sync_formula;
  std::vector<MessagePlan> messages;

  // Every device any term is charged to, sorted.
  std::vector<std::string> Devices() const;
  // Σ over processes of their terms on `device`.
  int64_t DeviceBytes(const std::string& device) const;
};

// A plan fits when every device's total is at most this share of its
// capacity (the rest: the allocator's fragmentation, the page cache, the
// driver, what the plan does not count).
inline constexpr double kPlanFitShare = 0.9;

// The plan of the run `inputs.config` describes (`kappa run`'s processes:
// learner.world_size learners, `workers` rollout workers, a teacher, a
// verifier).
MemoryPlan PlanMemory(const PlanInputs& inputs);

// The process name of the learner's shared base terms, per binary (the
// measured empty-process resident sizes).
int64_t ProcessBaseBytes(const std::string& binary);

// OK when every device's total is at most kPlanFitShare × its capacity and
// every message is within its limit. Else FAILED_PRECONDITION naming the
// process that needs the most on the device, the term of it to change and
// its key, e.g. "learner needs 31.2 GiB of host memory (the run 33.0 GiB,
// 0.9 × 24.0 GiB available): its largest term that a key changes is 'vocab
// head' 21.1 GiB (trainer.vocab_chunk_positions=0; try 1024)"; or the
// message, its size, the limit and the keys. A device without a capacity
// (absent or <= 0 in `capacity`) is not checked.
absl::Status CheckPlanFits(const MemoryPlan& plan, const services::Config& config,
                           const std::map<std::string, int64_t>& capacity);

// "1.23 GiB", "45.6 MiB", "789 KiB", "12 B".
std::string FormatBytes(int64_t bytes);

}  // namespace kappa::cli
