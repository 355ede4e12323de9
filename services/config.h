// The one run configuration, shared by every process: a YAML file plus
// `key=value` command-line overrides (`trainer.steps=20 workers=3`).
// Every key has a default; unknown keys and wrong types are errors that name
// the file, line and key path. Adding a key: add the member below and one
// KAPPA_CONFIG_FIELD(path, "description") line to the table in config.cc,
// then regenerate docs/configuration.md (see ConfigReferenceMarkdown).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/config_choices.h"

namespace kappa::services {

struct ModelShape {  // mirrors model::ModelConfig sizes
  int64_t hidden_size = 64;
  int64_t intermediate_size = 176;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 4;
  int64_t max_position_embeddings = 32;
};

struct SftConfig {  // `kappa sft` and the demo's bootstrap
  int64_t steps = 1000;
  int64_t batch_size = 64;
  double lr = 3e-3;
  double weight_decay = 0.0;
  int64_t warmup_steps = 50;
  int64_t train_examples = 0;  // 0: the whole train split; else the first N
  uint64_t seed = 1;
  // "": the true answers; else a tasks::AnswerCorruption rule: the examples
  // it covers are trained on its wrong answers (an unreliable teacher).
  std::string corrupt;
  // With `corrupt`: the chance, in (0, 1], that a covered example is drawn
  // with the rule's wrong answer; otherwise it is drawn with its true one.
  // Below 1 the model learns the mixture per prompt: mostly wrong where
  // the rule covers, yet right in some samples (reward variance there).
  double corrupt_fraction = 1.0;
  // > 0: every `check_every` steps, greedy accuracy on the first
  // trainer.eval_examples training prompts is measured, and training stops
  // at the first check that reaches it; `steps` is then a cap (and still
  // the length of the learning-rate schedule). 0: train all `steps`.
  double target_accuracy = 0.0;
  int64_t check_every = 50;
};

struct Config {
  // --- run
  std::string name = "demo";          // runs/<name>/
  std::string runs_dir = "runs";
  std::string data_dir = "runs/cache"; // bootstrap checkpoints cached here
  uint64_t seed = 1;
  int64_t workers = 2;                 // rollout worker processes `kappa run` starts
  std::string host = "127.0.0.1";      // bind/connect host for loopback runs
  int64_t threads_per_process = 1;     // libtorch intra-op threads (0 = libtorch default)

  // --- task
  struct Task {
    TaskKind kind = TaskKind::kArithmetic;
    int64_t min_digits = 1;
    int64_t max_digits = 2;
    std::string operators = "+";       // subset of "+-*"
    int64_t train_size = 2000;
    int64_t heldout_size = 200;
    HeldOutDraw heldout_draw = HeldOutDraw::kFirst;
    std::string train_path;            // jsonl only
    std::string heldout_path;          // jsonl only
    // jsonl: how a line maps to an example (tasks::JsonlOptions). messages_key
    // "": unused, else the member holding a list of {role, content}; format
    // "" | gsm8k | math: a preset of the keys and family; family: that of a
    // line without "task" ("": the format's, else arithmetic); skip_bad_lines:
    // skip and count malformed lines instead of failing.
    std::string prompt_key = "prompt";
    std::string messages_key;
    std::string answer_key = "answer";
    std::string format;
    std::string family;
    bool skip_bad_lines = false;
    // How a prompt becomes the model's input (tasks/prompt_format.h): auto
    // (chat when the student has a chat template, else raw) | chat | raw |
    // a custom text containing {prompt}.
    std::string prompt_template = "auto";
    // The chat system message when an example has none of its own; "": none
    // (the template's default applies).
    std::string system_prompt;
    // Extra chat-template variables, a JSON object: '{"enable_thinking": false}'.
    std::string chat_template_context;
  } task;

  // --- models
  struct Student {
    std::string checkpoint;            // empty: bootstrap into data_dir/student
    // Parameters of the rollout workers' copies: auto (bf16 on CUDA, fp32 on
    // the CPU) | bfloat16 | float32. The learner keeps fp32 master weights.
    ModelDtype dtype = ModelDtype::kAuto;
    ModelShape shape;
    SftConfig bootstrap;               // weak warm start
    // Low-rank adapters (PEFT's LoRA): with rank > 0 the learner freezes the
    // student's weights and trains adapters on `target_modules` only.
    struct Lora {
      int64_t rank = 0;  // 0: off (every weight trains)
      double alpha = 16.0;
      double dropout = 0.0;
      bool use_rslora = false;  // scaling alpha/sqrt(rank) instead of alpha/rank
      std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
      // A PEFT adapter directory the adapters start from (trained elsewhere,
      // or a previous run's checkpoint); empty: fresh adapters.
      std::string init;
    } lora;
  } student;
  struct Teacher {
    std::string checkpoint;            // empty: bootstrap into data_dir/teacher
    ModelDtype dtype = ModelDtype::kAuto;  // auto: bf16 on CUDA, fp32 on the CPU
    ModelShape shape;
    SftConfig bootstrap;               // strong teacher
    std::string address = "127.0.0.1:50052";
    int64_t max_batch_sequences = 64;
    int64_t max_wait_ms = 5;
    // Per-request cost budget, in token positions: Score's prompt + response
    // tokens over its sequences, Generate's num_samples × (prompt +
    // max_new_tokens). A request over it is RESOURCE_EXHAUSTED.
    int64_t max_request_positions = 1 << 20;
    int64_t threads = 1;
    std::string device = "cpu";  // cpu | cuda | cuda:N
    // logprobs: the teacher sends log-probs in the form the loss reads
    // (full rows, top-k + tail, or the sampled token's); hidden: it sends
    // its final hidden states and the learner applies the teacher's head
    // (loaded from `checkpoint`): the exact distribution at D_t values a
    // token (docs/algorithms.md §2.5).
    TeacherRowsForm rows = TeacherRowsForm::kLogprobs;
  } teacher;

  // --- services
  struct Verifier {
    std::string address = "127.0.0.1:50053";
    int64_t max_items = 4096;          // per Verify request
    // The reward of every item, whatever its task field: "" or task (each
    // item's own family) | exact | math | math_strict | code (tasks::RewardFamily).
    std::string reward;
  } verifier;
  struct Learner {
    std::string address = "127.0.0.1:50051";
    int64_t lease_timeout_ms = 30000;
    int64_t buffer_groups = 64;        // bounded buffer of scored groups
    int64_t max_staleness = 2;         // drop groups older than this many versions
    int64_t threads = 1;
    std::string device = "cpu";        // cpu | cuda | cuda:N (the rank's GPU under data parallel)
    // Data-parallel ranks (kappa-learner --rank N of world_size): each takes
    // its share of every batch; gradients are summed over ranks (c10d).
    int64_t world_size = 1;
    // Where the ranks meet: tcp://HOST:PORT (rank 0 listens) or file:///PATH.
    // kappa run picks a loopback port when world_size > 1 and this is empty.
    std::string dist_store;
    // none: every rank holds the whole AdamW state; optimizer: each holds
    // its 1 / world_size share of it (learner/algo/sharded_adamw.h).
    LearnerShard shard = LearnerShard::kNone;
    // Same-host workers that get every policy version in one c10d broadcast
    // (learner/weight_broadcaster.h); 0: none. The group meets at the store
    // (tcp://HOST:PORT, the learner listens; kappa run picks one if empty).
    int64_t weight_group_workers = 0;
    std::string weight_group_store;
  } learner;
  // Transport security of every gRPC channel and server (docs/security.md).
  // Off by default: the local demo runs on loopback.
  struct Security {
    bool tls = false;                  // TLS on every server and channel
    std::string cert_file;             // PEM chain: this process's server cert (and client cert under mutual_tls)
    std::string key_file;              // PEM private key of cert_file
    std::string ca_file;               // PEM CA bundle the peers' certificates must chain to
    bool mutual_tls = false;           // servers require and verify a client certificate
    std::string server_name;           // TLS name to verify instead of the address's host (e.g. when dialing an IP)
    // Bearer token every call carries and every server checks. Only a file
    // path here (or the KAPPA_AUTH_TOKEN environment variable), never the
    // token itself: config files get copied, logged and committed.
    std::string token_file;
    // Server side: a directory of <role>.token files (worker, observer); a
    // caller presenting one gets that role (services/rpc_roles.h). Other
    // files are ignored. Empty: servers accept token_file's token as a
    // worker's, or check none.
    std::string tokens_dir;
    // A server bound to a non-loopback address without client
    // authentication (mutual_tls or a token) refuses to start unless this
    // is true; then it logs a warning every minute.
    bool allow_insecure = false;
    int64_t max_message_bytes = 64 << 20;  // gRPC send/receive limit of every server and channel
    // Every server's bound on the threads serving calls (a gRPC
    // ResourceQuota: beyond it a call gets RESOURCE_EXHAUSTED) and on the
    // concurrent streams (calls) of one client connection.
    int64_t server_max_threads = 512;
    int64_t max_concurrent_streams = 100;
    // Dead-peer detection on every channel and server: an HTTP/2 ping after
    // this long without traffic, the connection declared dead when the ack
    // takes longer than the timeout (docs/reliability.md).
    int64_t keepalive_time_ms = 20000;
    int64_t keepalive_timeout_ms = 10000;
  } security;

  struct Rollout {
    int64_t max_outstanding = 2;       // work items a worker holds at once
    double temperature = 1.0;
    double top_p = 1.0;
    int64_t max_new_tokens = 8;
    int64_t threads = 1;
    int64_t rpc_deadline_ms = 10000;
    std::string device = "cpu";        // cpu | cuda | cuda:N: where the worker's policy samples
    // Generation also ends at the first occurrence of any of these in the
    // decoded response, cut right after the token that completes it (vLLM's
    // `stop`; such a response is stopped, not truncated). Strings with a
    // comma or surrounding spaces need the YAML list form, not key=value.
    std::vector<std::string> stop_strings;
    int64_t max_batch_rows = 0;  // engine slots; 0: max_outstanding × trainer.group_size
    // KV capacity of each slot in tokens (prompt + response), preallocated;
    // 0: grown to the longest sequence seen, up to max_position_embeddings.
    int64_t max_sequence_tokens = 0;
    int64_t top_k = 0;   // sample among the k most likely tokens; 0: off
    double min_p = 0.0;  // drop tokens below min_p × the top token's probability
    // Precision of the policy weights on the wire: auto (the worker's
    // student.dtype), float32 or bfloat16.
    ModelDtype weights_dtype = ModelDtype::kAuto;
    // A version travels as a lossless delta against the one the worker holds.
    bool weight_delta = false;
    // "grpc" (WatchPolicy) or "c10d" (the learner's weight group, falling
    // back to WatchPolicy when it cannot form or closes).
    WeightTransport weight_transport = WeightTransport::kGrpc;
  } rollout;

  // --- training
  struct Trainer {
    int64_t steps = 60;
    int64_t groups_per_step = 8;       // prompts per optimizer step
    int64_t group_size = 8;            // G
    // The rate: a linear warm-up over warmup_steps (0: none) to lr, then
    // lr_schedule: constant | cosine (to min_lr_ratio · lr at `steps`).
    double lr = 1e-3;
    int64_t warmup_steps = 0;
    Schedule lr_schedule = Schedule::kConstant;
    double min_lr_ratio = 0.0;
    double weight_decay = 0.0;
    double max_grad_norm = 1.0;
    // A step whose loss terms or gradient norm are NaN or ±inf is skipped
    // (nothing applied or published); this many skipped in a row stop the
    // learner with an error (>= 1).
    int64_t max_nonfinite_steps = 3;
    double lambda = 1.0;               // L = w_R L_R + λ L_D
    // λ over the run, a baseline to M3 that measures nothing: constant, or
    // cosine (a linear warm-up over lambda_warmup_steps to λ, then a cosine
    // decay to lambda_min_ratio · λ at `steps`; CHORD and KDRL anneal their
    // distillation weight so).
    Schedule lambda_schedule = Schedule::kConstant;
    int64_t lambda_warmup_steps = 0;
    double lambda_min_ratio = 0.0;
    double reward_weight = 1.0;        // w_R: 0 trains on distillation alone (OPD only)
    Aggregation aggregation = Aggregation::kTokenMean;
    DistillLoss distill_loss = DistillLoss::kReverseKl;
    bool norm_std = true;
    // The std the advantage divides by: population (ddof 0, the default) |
    // sample (ddof 1, as verl, TRL and OpenRLHF); docs/algorithms.md §2.1.
    AdvantageStd advantage_std = AdvantageStd::kPopulation;
    // Responses that hit their token budget without a stop id or string:
    // keep (train on them as they are; verl's default) | mask (their tokens
    // leave L_R and L_D, their reward still counts in the group's mean/std:
    // DAPO's overlong filtering) | zero_reward (reward 0 before advantages).
    TruncatedResponses truncated = TruncatedResponses::kKeep;
    double clip_low = 0.2;
    double clip_high = 0.28;
    double dual_clip = 3.0;
    int64_t eval_every = 10;           // steps; 0 disables periodic eval
    int64_t eval_examples = 200;       // held-out examples per evaluation
    int64_t checkpoint_every = 20;     // steps; 0: only at the end
    int64_t distill_topk = 8;          // k of the top-k distillation losses
    // fp32 | bf16: the teacher log-probs' precision on the wire. bf16 halves
    // the values' bytes (top-64 over V = 152k: 384 instead of 512 B/token)
    // at about 3 significant digits per log-prob; the learner computes in fp32.
    Precision teacher_values = Precision::kFloat32;
    // fp32 | bf16: bf16 runs the learner's forward passes under autocast
    // (matmuls in bfloat16; weights, gradients, optimizer state and loss
    // reductions in float32). For CUDA; on a CPU it is correct but slow.
    Precision precision = Precision::kFloat32;
    // Gradient accumulation: > 0 splits each step's batch (this rank's share)
    // into micro-batches of at most this many sequences, bucketed by length
    // so each pads only to its own longest; one optimizer step over the sum.
    // 0: the whole batch in one forward.
    int64_t micro_batch_sequences = 0;
    // > 0: the output projection, log-softmax and every loss term over the
    // vocabulary run in chunks of this many positions (response positions
    // only), so no [B, L, V] tensor is held; 0: one [B, L, V] per micro-batch.
    int64_t vocab_chunk_positions = 0;
    // With vocab_chunk_positions > 0: true runs the training forward through
    // the fused head (both losses' logit gradients, K_DR and m3_mask in the
    // forward's one pass over V; ∂/∂W of each loss, or of the precombined
    // loss of a plain step, held until the backward); false recomputes each
    // chunk's logits in every backward pass.
    bool fused_head = true;
    // Recompute each decoder layer in backward instead of keeping its
    // activations (same gradients; more compute, less memory).
    bool activation_checkpointing = false;
    // Seed of the RL phase alone (prompt order, worker sampling, K_DR
    // position sampling); 0: use the top-level `seed`. Varying it keeps the
    // dataset and the bootstrap checkpoints, which `seed` also determines.
    uint64_t seed = 0;
    // Which samples the distillation term sees: none (GRPO only) | all (naive
    // hybrid) | rstg (negative zero-variance groups, see rstg.*).
    DistillGate distill_gate = DistillGate::kAll;
    // Gradient balancing (docs/algorithms.md §4): [naive] or any of m3_norm, m3_mask,
    // m3_project, m3_adapt (m3_norm and m3_adapt exclude each other).
    std::vector<BalanceMethod> balance = {BalanceMethod::kNaive};
    double kappa_target = 1.0;         // m3_norm / m3_adapt: ‖g_R‖ / ‖scaled g_D‖
  } trainer;

  struct M3 {
    MaskTarget mask_target = MaskTarget::kReward;  // the term dropped where K_DR < 0
    KdrEstimator mask_estimator =
        KdrEstimator::kLogit;             // logit | last_layer (same sign; differ when soft)
    double mask_temperature = 0.0;        // 0: hard mask; τ > 0: weight σ(K_DR / τ)
    double adapt_gain = 0.5;              // λ ← λ · (κ_eff_ema / κ_target)^gain, per step
    double adapt_ema = 0.1;               // EMA coefficient of κ_eff
    double adapt_max_factor = 1.1;        // per-step change of λ bounded to [1/f, f]
    double lambda_min = 1e-3;
    double lambda_max = 1e3;
  } m3;

  struct Rstg {
    RstgConfidence confidence =
        RstgConfidence::kMaxProb;  // max_prob: mean_t max_v q | token_prob: exp(mean_t log q(y_t))
    RstgTokenSelector token_selector = RstgTokenSelector::kEntropy;
    double token_frac = 0.5;                // keep the top fraction of gated tokens
    double entropy_threshold = -1.0;        // >= 0: keep H(p_n) >= threshold instead of token_frac
    double divergence_threshold = -1.0;     // >= 0: keep ℓ_D(n) >= threshold instead of token_frac
    int64_t teacher_samples = 4;            // K teacher responses per negative zero-variance prompt (0: no teacher SFT)
    double teacher_temperature = 1.0;
    double sft_weight = 0.1;                // μ of the teacher-SFT NLL term
  } rstg;

  struct Monitor {
    int64_t kappa_every = 1;           // steps between κ measurements (0: never)
    int64_t kdr_every = 1;             // steps between cheap K_DR measurements (0: never)
    KdrEstimator kdr_estimator = KdrEstimator::kLastLayer;  // the one the statistics use
    int64_t kdr_exact_every = 0;       // opt-in: steps between exact K_DR samples (0: never)
    int64_t kdr_exact_positions = 32;  // positions per exact sample
    // The conflict atlas: the positions with the most negative K_DR of each
    // step (with their text, the teacher's preferred tokens, the advantage
    // and the reward) appended to <run>/conflict_atlas.jsonl; 0: off.
    int64_t atlas_positions = 4;
  } monitor;

  struct Alarms {
    double kappa_threshold = 10.0;     // magnitude drowning: κ EMA above this ...
    double ema_alpha = 0.1;            // EMA coefficient for κ, reward, L_D, entropy
    int64_t slope_window = 20;         // ... while the L_D EMA rose over this many steps
    double min_relative_rise = 0.02;   // ... by more than this fraction of its value
    double conflict_threshold = 0.5;   // |K_DR|-weighted negative fraction above this ...
    int64_t conflict_window = 20;      // ... for this many consecutive steps
    int64_t collapse_window = 20;      // consecutive steps out of band before collapse fires
    double reward_drop_ratio = 0.5;    // reward EMA below this × its best EMA
    double reward_drop_min = 0.15;     // ... and at least this far below it
    double distill_rise_factor = 3.0;  // L_D EMA above this × its minimum EMA
    double entropy_floor = 0.01;       // entropy EMA below this (nats)
    int64_t warmup_steps = 10;         // no alarm before this many observations
    int64_t clear_steps = 10;          // an alarm clears after this many steps without its condition
    // inference_mismatch: mean |log π_learner − log π_behaviour| on tokens
    // sampled with the current version above this.
    double mismatch_threshold = 0.1;
  } alarms;

  // What the learner writes besides metrics.jsonl (learner/tensorboard_log.h).
  struct Logging {
    bool tensorboard = true;  // <run_dir>/events.out.tfevents.*: every metrics scalar
  } logging;

  // `kappa plan` and the check `kappa run` makes before it starts anything
  // (cli/memory_plan.h): the capacities the plan must fit, 0 = detect.
  struct Plan {
    int64_t host_memory_bytes = 0;    // 0: MemAvailable (or the cgroup's headroom if lower)
    int64_t device_memory_bytes = 0;  // 0: each GPU's free memory (CUDA builds)
    int64_t prompt_tokens = 0;        // the longest prompt; 0: tokenize the task's prompts
  } plan;
};

// The student's and the teacher's model directories: the configured
// checkpoint, or where the bootstrap (kappa run's SFT warm start) puts it.
inline std::string StudentModelDir(const Config& config) {
  return config.student.checkpoint.empty() ? config.data_dir + "/student"
                                           : config.student.checkpoint;
}
inline std::string TeacherModelDir(const Config& config) {
  return config.teacher.checkpoint.empty() ? config.data_dir + "/teacher"
                                           : config.teacher.checkpoint;
}

// The seed of the RL phase: trainer.seed, or `seed` when that is 0.
inline uint64_t RlSeed(const Config& config) {
  return config.trainer.seed != 0 ? config.trainer.seed : config.seed;
}

// Loads `path` (YAML), then applies overrides ("a.b=value"). Errors:
// INVALID_ARGUMENT "<file>:<line>: unknown key 'trainer.stepz'" /
// "<file>:<line>: key 'trainer.steps' expects an integer, got 'ten'" /
// "override 'x=1': unknown key 'x'".
absl::StatusOr<Config> LoadConfig(const std::string& path,
                                  const std::vector<std::string>& overrides = {});
// From YAML text (file name only used in messages).
absl::StatusOr<Config> ParseConfig(const std::string& yaml_text, const std::string& file_name,
                                   const std::vector<std::string>& overrides = {});
// Config overrides from the environment, for containers that share one
// mounted config file: every variable KAPPA_CFG_<SECTION>__<KEY>=value
// becomes "section.key=value" (lower-cased; "__" separates levels, so
// KAPPA_CFG_TRAINER__GROUPS_PER_STEP=8 is trainer.groups_per_step=8 and
// KAPPA_CFG_WORKERS=3 is workers=3). They come before `overrides` (the
// command line wins), in variable-name order. INVALID_ARGUMENT naming the
// variable when one is not a known key or its value does not parse.
absl::StatusOr<std::vector<std::string>> WithEnvironmentOverrides(
    const std::vector<std::string>& overrides, const char* const* environment);

// Every key path the config accepts ("trainer.steps", ...), in file order.
std::vector<std::string> ConfigKeys();

// The resolved configuration as YAML (every key, defaults included); parsing
// it back yields an equal Config.
std::string ConfigToYaml(const Config& config);

// The one-line description of `key` in the key table ("" for an unknown key).
std::string ConfigKeyDescription(const std::string& key);

// docs/configuration.md: a header saying it is generated and how to
// regenerate it (`build/cli/kappa config-reference > docs/configuration.md`),
// then one table per top-level section (run, task, student, ...) of every key:
// key | type | default (of a default-constructed Config) | description.
// Deterministic: the table order, and defaults formatted as ConfigToYaml does.
std::string ConfigReferenceMarkdown();

}  // namespace kappa::services
