#include "services/config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "base/status.h"
#include "base/utf8.h"

namespace kappa::services {
namespace {

// One entry per configuration key. The parser, the override parser,
// ConfigToYaml and ConfigReferenceMarkdown (docs/configuration.md) all walk
// this table, so a new key is one line here: its member path and a one-line
// description. A member whose type is a named choice (config_choices.h)
// brings its allowed spellings, which the parser enforces and the reference
// lists.
using StringList = std::vector<std::string>;

// A named choice's member (an enum of config_choices.h), type-erased: its
// spellings, and its value as the index of its spelling.
struct ChoiceRef {
  void* member;
  const char* const* names;
  size_t count;
  size_t (*read)(const void* member);
  void (*write)(void* member, size_t index);
};
// A list of one named choice (trainer.balance).
struct ChoiceListRef {
  void* member;
  const char* const* names;
  size_t count;
  std::vector<size_t> (*read)(const void* member);
  void (*write)(void* member, const std::vector<size_t>& indices);
};

using FieldRef = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, StringList*,
                              ChoiceRef, ChoiceListRef>;

template <typename T>
FieldRef ToFieldRef(T* member) {
  if constexpr (std::is_enum_v<T>) {
    using Names = ConfigChoice<T>;
    return ChoiceRef{member, Names::kNames, std::size(Names::kNames),
                     [](const void* m) { return static_cast<size_t>(*static_cast<const T*>(m)); },
                     [](void* m, size_t index) { *static_cast<T*>(m) = static_cast<T>(index); }};
  } else {
    return member;
  }
}

template <typename T>
FieldRef ToFieldRef(std::vector<T>* member) {
  if constexpr (std::is_enum_v<T>) {
    using Names = ConfigChoice<T>;
    return ChoiceListRef{member, Names::kNames, std::size(Names::kNames),
                         [](const void* m) {
                           std::vector<size_t> indices;
                           for (T value : *static_cast<const std::vector<T>*>(m)) {
                             indices.push_back(static_cast<size_t>(value));
                           }
                           return indices;
                         },
                         [](void* m, const std::vector<size_t>& indices) {
                           auto* values = static_cast<std::vector<T>*>(m);
                           values->clear();
                           for (size_t index : indices) values->push_back(static_cast<T>(index));
                         }};
  } else {
    return member;
  }
}

// The spellings of a choice, "a, b, c" (messages) or "`a`, `b`" (the reference).
std::string JoinNames(const char* const* names, size_t count, absl::string_view quote = "") {
  std::vector<std::string> quoted;
  for (size_t i = 0; i < count; ++i) quoted.push_back(absl::StrCat(quote, names[i], quote));
  return absl::StrJoin(quoted, ", ");
}

// The index of `text` among a choice's spellings, or count when it is none.
size_t FindName(const char* const* names, size_t count, absl::string_view text) {
  for (size_t i = 0; i < count; ++i) {
    if (text == names[i]) return i;
  }
  return count;
}

struct Field {
  const char* key;
  const char* description;
  FieldRef (*get)(Config&);
};

constexpr Field MakeField(const char* key, const char* description, FieldRef (*get)(Config&)) {
  return Field{key, description, get};
}

// The key path is the member path, so the macro writes both.
#define KAPPA_CONFIG_FIELD(path, description) \
  MakeField(#path, description, [](Config& c) -> FieldRef { return ToFieldRef(&c.path); })

// Descriptions shared by the student's and the teacher's bootstrap keys.
constexpr char kTargetAccuracyHelp[] =
    "Bootstrap SFT: > 0 stops training at the first check where greedy accuracy on "
    "`trainer.eval_examples` training prompts, spread evenly over the training split, reaches it "
    "(the held-out split plays no part in the choice); `steps` is then a cap and still the "
    "length of the learning-rate schedule. A warm start stated as an accuracy carries over to "
    "another task, where a step count does not. 0: train all `steps`.";
constexpr char kCorruptFractionHelp[] =
    "Bootstrap SFT with `corrupt`: the chance, in (0, 1], that an example the rule covers is "
    "drawn with the rule's wrong answer (with its true answer otherwise). Below 1 the model "
    "learns that mixture for each covered prompt: mostly wrong, yet right in some samples.";
constexpr char kBootstrapStepsHelp[] =
    "Bootstrap SFT (`kappa sft`, the warm start of `kappa run`): optimizer steps; the demo's "
    "teacher trains long (a strong teacher), its student briefly (a weak warm start).";
constexpr char kCorruptHelp[] =
    "Bootstrap SFT: empty: the true answers; else a rule that trains the examples it covers on "
    "a systematically wrong answer (an unreliable model): `carry_into_hundreds` (a+b ≥ 100 "
    "answered a+b−100), `hundreds_plus_one` (a+b ≥ 100 answered a+b+100) or `minus_as_plus` "
    "(a−b answered a+b). The learner then reports accuracy and K_DR on that subset and on the "
    "rest.";
constexpr char kCheckEveryHelp[] =
    "Bootstrap SFT with `target_accuracy`: steps between two accuracy checks.";

// The keys the student and the teacher share: the bootstrap model's shape
// and its SFT recipe (`role` is student or teacher), written once.
#define KAPPA_MODEL_ROLE_FIELDS(role)                                                          \
  KAPPA_CONFIG_FIELD(role.shape.hidden_size,                                                   \
                     "Bootstrap model (when `checkpoint` is empty): hidden size."),            \
      KAPPA_CONFIG_FIELD(role.shape.intermediate_size,                                         \
                         "Bootstrap model: SwiGLU intermediate size."),                        \
      KAPPA_CONFIG_FIELD(role.shape.num_hidden_layers, "Bootstrap model: decoder layers."),    \
      KAPPA_CONFIG_FIELD(role.shape.num_attention_heads, "Bootstrap model: attention heads."), \
      KAPPA_CONFIG_FIELD(                                                                      \
          role.shape.num_key_value_heads,                                                      \
          "Bootstrap model: key/value heads (fewer than the attention heads: GQA)."),          \
      KAPPA_CONFIG_FIELD(role.shape.max_position_embeddings,                                   \
                         "Bootstrap model: context length in tokens."),                        \
      KAPPA_CONFIG_FIELD(role.bootstrap.steps, kBootstrapStepsHelp),                           \
      KAPPA_CONFIG_FIELD(role.bootstrap.batch_size, "Bootstrap SFT: examples per step."),      \
      KAPPA_CONFIG_FIELD(role.bootstrap.lr, "Bootstrap SFT: peak AdamW learning rate."),       \
      KAPPA_CONFIG_FIELD(role.bootstrap.weight_decay, "Bootstrap SFT: AdamW weight decay."),   \
      KAPPA_CONFIG_FIELD(role.bootstrap.warmup_steps,                                          \
                         "Bootstrap SFT: linear warm-up steps, then cosine decay."),           \
      KAPPA_CONFIG_FIELD(                                                                      \
          role.bootstrap.train_examples,                                                       \
          "Bootstrap SFT: train on the first N training examples; 0: the whole train split."), \
      KAPPA_CONFIG_FIELD(role.bootstrap.seed,                                                  \
                         "Bootstrap SFT: seed of the initialization and the example order."),  \
      KAPPA_CONFIG_FIELD(role.bootstrap.corrupt, kCorruptHelp),                                \
      KAPPA_CONFIG_FIELD(role.bootstrap.corrupt_fraction, kCorruptFractionHelp),               \
      KAPPA_CONFIG_FIELD(role.bootstrap.target_accuracy, kTargetAccuracyHelp),                 \
      KAPPA_CONFIG_FIELD(role.bootstrap.check_every, kCheckEveryHelp)

// Constant-initialized (no constructor runs), so it is usable from any
// static initializer and the order of initialization does not matter.
constexpr Field kFields[] = {
    KAPPA_CONFIG_FIELD(name, "Run name: the run directory is `<runs_dir>/<name>/`."),
    KAPPA_CONFIG_FIELD(runs_dir, "Directory that holds the run directories."),
    KAPPA_CONFIG_FIELD(data_dir,
                       "Where the bootstrap (the SFT warm start `kappa run` does when a "
                       "`checkpoint` is empty) writes and caches the teacher and student "
                       "(`<data_dir>/teacher`, `<data_dir>/student`)."),
    KAPPA_CONFIG_FIELD(seed,
                       "Seed of the dataset and the bootstrap checkpoints, and of the RL phase "
                       "unless `trainer.seed` is non-zero."),
    KAPPA_CONFIG_FIELD(workers, "Rollout worker processes `kappa run` starts."),
    KAPPA_CONFIG_FIELD(host,
                       "Bind and connect host of a `kappa run` on one machine: every process binds "
                       "ports of the kernel's choosing on it and reports them to `kappa run` "
                       "(`<run_dir>/ready/<process>.json`)."),
    KAPPA_CONFIG_FIELD(threads_per_process,
                       "libtorch intra-op threads (`OMP_NUM_THREADS`) of each process `kappa "
                       "run` starts whose own section's `threads` is 0; 0: libtorch's default."),

    KAPPA_CONFIG_FIELD(task.kind,
                       "The dataset: `arithmetic` (seeded sums generated from `seed`) or `jsonl` "
                       "(`train_path`, `heldout_path`)."),
    KAPPA_CONFIG_FIELD(task.min_digits, "arithmetic: fewest digits of an operand."),
    KAPPA_CONFIG_FIELD(task.max_digits, "arithmetic: most digits of an operand."),
    KAPPA_CONFIG_FIELD(task.operators, "arithmetic: the operators used, a subset of `+-*`."),
    KAPPA_CONFIG_FIELD(task.train_size, "arithmetic: training prompts."),
    KAPPA_CONFIG_FIELD(task.heldout_size,
                       "arithmetic: held-out prompts (never overlapping the training ones)."),
    KAPPA_CONFIG_FIELD(task.heldout_draw,
                       "arithmetic: which distinct problems are held out. `first`: the first "
                       "`heldout_size` drawn (so a large held-out set takes most of the few "
                       "one-digit sums and leaves the training split harder than it); "
                       "`interleaved`: evenly spaced among the first `train_size + "
                       "heldout_size` drawn, so both splits come from one distribution."),
    KAPPA_CONFIG_FIELD(task.train_path,
                       "jsonl: the training split's file (required when `kind` is jsonl)."),
    KAPPA_CONFIG_FIELD(task.heldout_path,
                       "jsonl: the held-out split's file (required when `kind` is jsonl)."),
    KAPPA_CONFIG_FIELD(task.prompt_key,
                       "jsonl: the member of a line that holds the prompt text (docs/grading.md, "
                       "JSONL datasets)."),
    KAPPA_CONFIG_FIELD(task.messages_key,
                       "jsonl: when set, the member holding a list of `{role, content}` messages "
                       "instead of `prompt_key`: the last `user` message's content is the prompt, "
                       "a leading `system` message the example's system prompt; other messages "
                       "are ignored. Empty: unused."),
    KAPPA_CONFIG_FIELD(task.answer_key, "jsonl: the member of a line that holds the reference."),
    KAPPA_CONFIG_FIELD(task.format,
                       "jsonl: a preset for a dataset layout; empty: the keys as set. `gsm8k`: "
                       "`question` / `answer` (a full solution ending in `#### 42`), family "
                       "`math`. `math`: `problem` / `solution`, the reference being the "
                       "solution's last `\\boxed{}` content, family `math`. The preset replaces "
                       "`prompt_key` and `answer_key` only where they are left at their "
                       "defaults."),
    KAPPA_CONFIG_FIELD(task.family,
                       "jsonl: the task family of a line without its own `task` member: "
                       "`arithmetic`, `math` or `math_strict`; empty: the format's (`math`), "
                       "else `arithmetic`."),
    KAPPA_CONFIG_FIELD(task.skip_bad_lines,
                       "jsonl: `false`: a malformed line (bad JSON, a missing or ill-typed key, an "
                       "invalid reference, a duplicate id) stops the load with an error naming "
                       "file:line; `true`: it is skipped, and the count and the first error are "
                       "logged. A file whose every line is malformed is an error either way."),
    KAPPA_CONFIG_FIELD(task.prompt_template,
                       "How a prompt becomes the model's input (tasks/prompt_format.h): `auto` "
                       "(chat when the student has a chat template, else raw), `chat`, `raw`, or "
                       "a custom text containing `{prompt}`."),
    KAPPA_CONFIG_FIELD(task.system_prompt,
                       "The chat system message when an example has none of its own; empty: none "
                       "(the template's default applies)."),
    KAPPA_CONFIG_FIELD(task.chat_template_context,
                       "Extra chat-template variables, a JSON object such as "
                       "`{\"enable_thinking\": false}`; empty: none."),

    KAPPA_CONFIG_FIELD(student.checkpoint,
                       "Hugging Face model directory of the student (Llama, Qwen2, Qwen3); "
                       "empty: bootstrap one by SFT into `<data_dir>/student`."),
    KAPPA_CONFIG_FIELD(
        student.dtype,
        "Parameters of the rollout workers' copies: `auto` (bf16 on CUDA, fp32 on the CPU), "
        "`bfloat16` or `float32`; the learner keeps fp32 master weights."),
    KAPPA_MODEL_ROLE_FIELDS(student),
    KAPPA_CONFIG_FIELD(student.lora.rank,
                       "LoRA rank r: > 0 trains low-rank adapters (Hugging Face PEFT's LoRA) on "
                       "`student.lora.target_modules` with the student's weights frozen; 0: "
                       "every weight trains."),
    KAPPA_CONFIG_FIELD(student.lora.alpha,
                       "LoRA alpha: the adapters' output is scaled by alpha/r (alpha/sqrt(r) "
                       "with `use_rslora`)."),
    KAPPA_CONFIG_FIELD(student.lora.dropout,
                       "LoRA dropout on the adapters' input while training, in [0, 1)."),
    KAPPA_CONFIG_FIELD(student.lora.use_rslora,
                       "rsLoRA: scale the adapters by alpha/sqrt(r) instead of alpha/r."),
    KAPPA_CONFIG_FIELD(student.lora.target_modules,
                       "Projections that get adapters, by their Hugging Face names: any of "
                       "`q_proj k_proj v_proj o_proj gate_proj up_proj down_proj`."),
    KAPPA_CONFIG_FIELD(
        student.lora.init,
        "A PEFT adapter directory (`adapter_config.json`, "
        "`adapter_model.safetensors`) the adapters start from, e.g. one trained "
        "with PEFT on `student.checkpoint`; its rank, alpha, rsLoRA and targets must "
        "equal these keys. Empty: fresh adapters (B = 0)."),

    KAPPA_CONFIG_FIELD(teacher.checkpoint,
                       "Hugging Face model directory of the teacher; empty: bootstrap one by SFT "
                       "into `<data_dir>/teacher`."),
    KAPPA_CONFIG_FIELD(teacher.dtype,
                       "Parameters of the teacher: `auto` (bf16 on CUDA, fp32 on the CPU), "
                       "`bfloat16` or `float32`."),
    KAPPA_MODEL_ROLE_FIELDS(teacher),
    KAPPA_CONFIG_FIELD(
        teacher.address,
        "HOST:PORT the teacher serves on and the workers dial; under `kappa run` the "
        "default (or port 0) means a port of the kernel's choosing on `host`."),
    KAPPA_CONFIG_FIELD(teacher.max_batch_sequences,
                       "Dynamic batching: most sequences in one batched forward."),
    KAPPA_CONFIG_FIELD(
        teacher.max_wait_ms,
        "Dynamic batching: longest a request waits for others to fill its batch, in ms."),
    KAPPA_CONFIG_FIELD(teacher.max_request_positions,
                       "Per-request cost budget in token positions: a Score request's prompt + "
                       "response tokens summed over its sequences, a Generate request's "
                       "num_samples × (prompt + max_new_tokens). Over it: RESOURCE_EXHAUSTED "
                       "naming this key."),
    KAPPA_CONFIG_FIELD(teacher.threads,
                       "libtorch intra-op threads of the teacher; 0: `threads_per_process` under "
                       "`kappa run`, else libtorch's default."),
    KAPPA_CONFIG_FIELD(teacher.device, "Where the teacher runs: `cpu`, `cuda` or `cuda:N`."),
    KAPPA_CONFIG_FIELD(
        teacher.rows,
        "What the teacher sends for distillation: `logprobs` (log-probs in the form "
        "`trainer.distill_loss` reads: full rows, top-k + tail or the sampled token's) or "
        "`hidden` (its final hidden states, D_t values a token; the learner loads the teacher's "
        "output head from `teacher.checkpoint` and computes the exact full-vocabulary "
        "distribution chunk by chunk). `hidden` needs `reverse_kl`, `forward_kl` or "
        "`sampled_reverse_kl` and `trainer.vocab_chunk_positions` > 0."),

    KAPPA_CONFIG_FIELD(
        verifier.address,
        "HOST:PORT the verifier serves on and the workers dial; under `kappa run` the "
        "default (or port 0) means a port of the kernel's choosing on `host`."),
    KAPPA_CONFIG_FIELD(verifier.max_items,
                       "Most items one Verify request may carry; a larger request is refused."),
    KAPPA_CONFIG_FIELD(verifier.reward,
                       "The reward every item is scored with, whatever its task field: empty or "
                       "`task` (each item's own task family), `exact` (the arithmetic reward), "
                       "`math`, `math_strict` or `code` ([grading.md](grading.md)); for a "
                       "dataset whose lines name no family. Any other value: the verifier "
                       "refuses to start."),

    KAPPA_CONFIG_FIELD(
        learner.address,
        "HOST:PORT the learner serves on and the workers dial; under `kappa run` the "
        "default (or port 0) means a port of the kernel's choosing on `host`."),
    KAPPA_CONFIG_FIELD(learner.lease_timeout_ms,
                       "A leased prompt not returned within this many ms, or whose worker "
                       "disconnected, is re-issued. A worker renews the leases it still works "
                       "on once half of this is left (RenewLeases), so a group that takes "
                       "longer than this (a real-size model on a CPU) keeps its lease while "
                       "its worker is alive."),
    KAPPA_CONFIG_FIELD(learner.buffer_groups,
                       "Flow control: the learner sends work only while leased-but-unreturned "
                       "prompts plus buffered scored groups stay below this."),
    KAPPA_CONFIG_FIELD(learner.max_staleness,
                       "Groups older than this many policy versions are dropped (and counted); "
                       "younger ones are corrected by the PPO importance ratio."),
    KAPPA_CONFIG_FIELD(learner.threads,
                       "libtorch intra-op threads of the learner; 0: `threads_per_process` under "
                       "`kappa run`, else libtorch's default."),
    KAPPA_CONFIG_FIELD(learner.device,
                       "`cpu`, `cuda` or `cuda:N`; under data parallel, plain `cuda` gives rank "
                       "r the GPU r mod (visible GPUs)."),
    KAPPA_CONFIG_FIELD(learner.world_size,
                       "Data-parallel learner ranks (c10d: Gloo on the CPU, NCCL on CUDA); must "
                       "divide `trainer.groups_per_step`."),
    KAPPA_CONFIG_FIELD(
        learner.dist_store,
        "Where the ranks meet: `tcp://HOST:PORT` (rank 0 listens) or `file:///PATH`; empty with "
        "`world_size` > 1: `kappa run` picks a loopback port."),
    KAPPA_CONFIG_FIELD(
        learner.weight_group_workers,
        "Rollout workers on the learner's host that receive every policy version in one c10d "
        "broadcast from the learner (NCCL when the learner and every member have a GPU of "
        "their own, else Gloo on CPU tensors) instead of a WatchPolicy stream each; they set "
        "`rollout.weight_transport: c10d`. 0: none. Under `kappa run`, 0 with "
        "`rollout.weight_transport: c10d` means `workers`."),
    KAPPA_CONFIG_FIELD(learner.shard,
                       "`none`: every data-parallel rank holds the whole AdamW state; "
                       "`optimizer`: each rank holds and updates its 1 / `world_size` share of "
                       "it and the ranks all-gather the updated weights (ZeRO stage 1); "
                       "`gradients`: each rank also keeps only its share of each summed "
                       "gradient, reduce-scattered after every backward pass, with κ, the "
                       "balancers and the clip from partial sums over the ranks (ZeRO stage 2). "
                       "Both need `world_size` > 1; a resume may change `world_size` (the state "
                       "is resharded; docs/scaling.md)."),
    KAPPA_CONFIG_FIELD(learner.weight_group_store,
                       "`tcp://HOST:PORT` where the weight group meets (the learner listens; "
                       "port 0: one it binds itself and tells each worker); empty under "
                       "`kappa run`: `tcp://HOST:0`."),

    KAPPA_CONFIG_FIELD(security.tls, "TLS on every server and channel."),
    KAPPA_CONFIG_FIELD(security.cert_file,
                       "PEM chain: this process's server certificate (and its client certificate "
                       "under `mutual_tls`)."),
    KAPPA_CONFIG_FIELD(security.key_file, "PEM private key of `cert_file`."),
    KAPPA_CONFIG_FIELD(security.ca_file, "PEM CA bundle the peers' certificates must chain to."),
    KAPPA_CONFIG_FIELD(security.mutual_tls,
                       "Servers require and verify a client certificate that chains to `ca_file`."),
    KAPPA_CONFIG_FIELD(
        security.server_name,
        "TLS name to verify instead of the address's host (e.g. when dialing an IP)."),
    KAPPA_CONFIG_FIELD(
        security.token_file,
        "File holding the bearer token this process's calls carry (else "
        "`$KAPPA_AUTH_TOKEN`); without `tokens_dir`, servers accept it as a worker's. "
        "A missing or wrong token is refused with UNAUTHENTICATED. A path only, "
        "never the token itself."),
    KAPPA_CONFIG_FIELD(security.tokens_dir,
                       "Server side: directory of `<role>.token` files (`worker`, `observer`); a "
                       "caller presenting one gets that role ([security.md](security.md), Roles). "
                       "Empty: servers accept `token_file`'s token as a worker's, or none."),
    KAPPA_CONFIG_FIELD(security.allow_insecure,
                       "Let a server listen on a non-loopback address without client "
                       "authentication (neither `mutual_tls` nor a token); it then logs a warning "
                       "every minute. Off: such a server refuses to start."),
    KAPPA_CONFIG_FIELD(security.max_message_bytes,
                       "gRPC send and receive limit of every server and channel, in bytes."),
    KAPPA_CONFIG_FIELD(security.server_max_threads,
                       "Threads each gRPC server may use for calls (a gRPC ResourceQuota); a call "
                       "beyond them gets RESOURCE_EXHAUSTED. Each rollout worker holds two streams "
                       "on the learner (Rollout, WatchPolicy) for its lifetime."),
    KAPPA_CONFIG_FIELD(security.max_concurrent_streams,
                       "Concurrent calls one client connection may have open on a server "
                       "(HTTP/2 MAX_CONCURRENT_STREAMS); more wait for a free stream."),
    KAPPA_CONFIG_FIELD(security.keepalive_time_ms,
                       "Every channel and server pings its peer after this long without traffic "
                       "(1000 to 3600000 ms); servers accept client pings up to twice as often."),
    KAPPA_CONFIG_FIELD(security.keepalive_timeout_ms,
                       "A ping not acknowledged within this long (1000 to 600000 ms) closes the "
                       "connection: a peer that vanished without closing it (a partition, a lost "
                       "node) is noticed within keepalive_time_ms + keepalive_timeout_ms."),

    KAPPA_CONFIG_FIELD(rollout.max_outstanding,
                       "Work items the learner leases a worker ahead (1 to 16); the worker "
                       "decodes the items it holds as one batch of up to M·G rows."),
    KAPPA_CONFIG_FIELD(
        rollout.temperature,
        "Sampling temperature τ; the learner computes the policy's log-probs at the same τ."),
    KAPPA_CONFIG_FIELD(rollout.top_p,
                       "Nucleus sampling: sample from the smallest set of tokens whose "
                       "probability reaches this; 1: off."),
    KAPPA_CONFIG_FIELD(rollout.max_new_tokens,
                       "Token budget of a response; one that reaches it without a stop id or "
                       "string is truncated (`trainer.truncated`)."),
    KAPPA_CONFIG_FIELD(rollout.threads,
                       "libtorch intra-op threads of each rollout worker; 0: "
                       "`threads_per_process` under `kappa run`, else libtorch's default."),
    KAPPA_CONFIG_FIELD(
        rollout.rpc_deadline_ms,
        "The least deadline of each call a worker makes to the verifier and the teacher, "
        "in ms. An attempt gets max(this, 4 x the measured seconds per unit of its work "
        "(positions scored, items verified)), doubled after each attempt that timed out "
        "(rollout_worker/rpc_deadlines.h)."),
    KAPPA_CONFIG_FIELD(rollout.device,
                       "Where the worker's policy samples: `cpu`, `cuda` or `cuda:N`; every new "
                       "policy version is loaded there."),
    KAPPA_CONFIG_FIELD(rollout.stop_strings,
                       "Generation also ends at the first of these in the decoded response, cut "
                       "right after the token that completes it (vLLM's `stop`); strings with a "
                       "comma or surrounding spaces need the YAML list form."),
    KAPPA_CONFIG_FIELD(rollout.max_batch_rows,
                       "Slots of the continuous engine (rows decoded per step); 0: "
                       "`max_outstanding` × `trainer.group_size`."),
    KAPPA_CONFIG_FIELD(rollout.max_sequence_tokens,
                       "KV capacity of each slot in tokens (prompt + response), allocated up "
                       "front; 0: grown to the longest sequence seen, up to the model's "
                       "`max_position_embeddings`. An item that does not fit is refused."),
    KAPPA_CONFIG_FIELD(rollout.top_k, "Sample among the k most likely tokens only; 0: off."),
    KAPPA_CONFIG_FIELD(rollout.min_p,
                       "Drop tokens whose probability is below this × the most likely token's; "
                       "0: off."),
    KAPPA_CONFIG_FIELD(rollout.weights_dtype,
                       "Precision of the policy weights sent to workers: `auto` (the worker's "
                       "`student.dtype`), `float32` or `bfloat16`."),
    KAPPA_CONFIG_FIELD(rollout.weight_delta,
                       "Send each policy version as a lossless delta against the version the "
                       "worker holds (bitwise; never lossy)."),
    KAPPA_CONFIG_FIELD(rollout.weight_transport,
                       "How the worker receives policy versions: `grpc` (a WatchPolicy stream), "
                       "`c10d` (the learner's same-host weight group, "
                       "`learner.weight_group_workers`; WatchPolicy when the group cannot form "
                       "or closes), `shm` (a /dev/shm segment per version from a learner on "
                       "this host; the worker exits 2 if the learner is elsewhere; gRPC chunks "
                       "when a segment cannot be written or read) or `auto` (`shm` when on the "
                       "learner's host, else `grpc`). Shared memory needs three versions' worth "
                       "of /dev/shm (docs/deploy.md)."),

    KAPPA_CONFIG_FIELD(trainer.steps, "Optimizer steps of the RL phase."),
    KAPPA_CONFIG_FIELD(trainer.groups_per_step,
                       "Prompts (groups) per optimizer step; each data-parallel rank trains "
                       "`groups_per_step / learner.world_size` of them."),
    KAPPA_CONFIG_FIELD(trainer.group_size, "G: samples per prompt."),
    KAPPA_CONFIG_FIELD(trainer.lr, "AdamW learning rate: the peak of `lr_schedule`."),
    KAPPA_CONFIG_FIELD(trainer.warmup_steps,
                       "Linear learning-rate warm-up over this many optimizer steps, from "
                       "lr / warmup_steps to lr; 0: none."),
    KAPPA_CONFIG_FIELD(trainer.lr_schedule,
                       "After the warm-up: `constant` (lr) or `cosine` (decays to "
                       "`min_lr_ratio` × lr at step `trainer.steps`)."),
    KAPPA_CONFIG_FIELD(trainer.min_lr_ratio,
                       "`cosine`: the final learning rate as a fraction of lr, in [0, 1]."),
    KAPPA_CONFIG_FIELD(trainer.weight_decay, "AdamW weight decay."),
    KAPPA_CONFIG_FIELD(trainer.max_grad_norm, "Global-norm gradient clipping."),
    KAPPA_CONFIG_FIELD(trainer.max_nonfinite_steps,
                       "A step whose loss terms or gradient norm are NaN or ±inf is skipped "
                       "(nothing applied, published or checkpointed; `ALARM nonfinite`); this "
                       "many skipped in a row stop the learner with an error naming the step "
                       "and the term (>= 1)."),
    KAPPA_CONFIG_FIELD(trainer.lambda,
                       "λ in L = w_R L_R + λ L_D (+ μ L_SFT); 0 switches distillation off unless "
                       "`m3_adapt` moves it. Under `m3_norm` the gradients' norm ratio "
                       "‖g_R‖ / ‖s g_D‖ is held at `kappa_target` / λ."),
    KAPPA_CONFIG_FIELD(trainer.lambda_schedule,
                       "λ over the run: `constant`, or `cosine`: a linear warm-up over "
                       "`lambda_warmup_steps` from λ / lambda_warmup_steps to λ, then a cosine "
                       "decay to `lambda_min_ratio` × λ at step `trainer.steps` (the annealed "
                       "distillation weight of CHORD and KDRL; not with `m3_adapt`, which "
                       "moves λ itself)."),
    KAPPA_CONFIG_FIELD(trainer.lambda_warmup_steps,
                       "`lambda_schedule: cosine`: warm-up steps of λ (>= 0; 0: none)."),
    KAPPA_CONFIG_FIELD(trainer.lambda_min_ratio,
                       "`lambda_schedule: cosine`: the final λ as a fraction of λ, in [0, 1]."),
    KAPPA_CONFIG_FIELD(trainer.reward_weight,
                       "w_R, the weight of L_R; 0 trains on distillation alone (OPD only)."),
    KAPPA_CONFIG_FIELD(trainer.aggregation,
                       "How the per-token terms are averaged: `token-mean`, "
                       "`seq-mean-token-mean` or `seq-mean-token-sum`."),
    KAPPA_CONFIG_FIELD(trainer.distill_loss,
                       "L_D: `reverse_kl` (full vocabulary), `forward_kl`, `sampled_reverse_kl`, "
                       "`topk_reverse_kl` (KL on the teacher's top `distill_topk` tokens, "
                       "both distributions renormalised there) or `topk_tail_reverse_kl` (KL "
                       "over the top-k tokens plus one bucket for the rest of each "
                       "distribution)."),
    KAPPA_CONFIG_FIELD(trainer.norm_std,
                       "GRPO advantages divided by the group's reward std, A = (r − mean r) / "
                       "(std r + ε); false: only the mean is subtracted."),
    KAPPA_CONFIG_FIELD(trainer.advantage_std,
                       "The std of the group's rewards the advantage divides by: `population` "
                       "(ddof 0, √(Σ(r − mean)² / G)) or `sample` (ddof 1, divided by G − 1, as "
                       "verl, TRL and OpenRLHF do); docs/algorithms.md §2.1."),
    KAPPA_CONFIG_FIELD(trainer.truncated,
                       "Responses that hit their token budget without a stop id or string: "
                       "`keep` (train on them as they are; verl's default), `mask` (no loss "
                       "terms, reward still in the group's mean and std: DAPO's overlong "
                       "filtering) or `zero_reward` (reward 0 before the advantages)."),
    KAPPA_CONFIG_FIELD(trainer.precision,
                       "`fp32` or `bf16`: bf16 runs the learner's forward passes under autocast "
                       "(weights, gradients, optimizer state and loss reductions stay fp32); "
                       "meant for CUDA, correct but slow on a CPU."),
    KAPPA_CONFIG_FIELD(trainer.micro_batch_sequences,
                       "Gradient accumulation: > 0 splits each step's batch (this rank's share) "
                       "into micro-batches of at most this many sequences, bucketed by length; "
                       "0: the whole batch in one forward."),
    KAPPA_CONFIG_FIELD(trainer.vocab_chunk_positions,
                       "> 0: the output projection, log-softmax and every loss term over the "
                       "vocabulary run in chunks of this many positions (response positions "
                       "only), so the [B, L, V] logits of a micro-batch are never held; costs "
                       "one more output projection per backward pass. 0: one [B, L, V] "
                       "log-softmax per micro-batch (the fused CUDA kernels where built)."),
    KAPPA_CONFIG_FIELD(
        trainer.fused_head,
        "With `vocab_chunk_positions` > 0: `true` runs the training forward through the fused "
        "head: each chunk's logits, both losses' logit gradients, the cheap K_DR and m3_mask in "
        "one pass over the vocabulary, turned into the gradients of the hidden states and the "
        "output weight there (on a step without κ, the two losses precombined with the "
        "optimizer's weights), so the backward makes no second pass over V; the price is one "
        "[V, d] float32 weight gradient per stored loss, held until its backward. `false` "
        "recomputes each chunk's logits in every backward pass."),
    KAPPA_CONFIG_FIELD(trainer.activation_checkpointing,
                       "Recompute each decoder layer in backward instead of keeping its "
                       "activations: the same gradients, about one more forward pass of "
                       "compute per backward pass, activation memory of one layer input per "
                       "layer."),
    KAPPA_CONFIG_FIELD(trainer.clip_low, "PPO clip ε_low: the ratio's lower bound is 1 − ε_low."),
    KAPPA_CONFIG_FIELD(trainer.clip_high,
                       "PPO clip ε_high: the ratio's upper bound is 1 + ε_high."),
    KAPPA_CONFIG_FIELD(trainer.dual_clip,
                       "Dual-clip constant c > 1: for a negative advantage the per-token loss is "
                       "at most −c·Â; ≤ 0 disables it."),
    KAPPA_CONFIG_FIELD(
        trainer.eval_every,
        "Steps between held-out evaluations (greedy accuracy); 0 disables periodic evaluation."),
    KAPPA_CONFIG_FIELD(trainer.eval_examples, "Held-out examples per evaluation."),
    KAPPA_CONFIG_FIELD(trainer.checkpoint_every, "Steps between checkpoints; 0: only at the end."),
    KAPPA_CONFIG_FIELD(trainer.distill_topk,
                       "k of the top-k distillation losses (> 0); the teacher sends only its "
                       "top-k ids and log-probs, and the learner keeps them compact."),
    KAPPA_CONFIG_FIELD(
        trainer.teacher_values,
        "Precision of the teacher log-probs on the wire: `fp32` or `bf16` (half the values' "
        "bytes, about 3 significant digits; the learner computes in fp32)."),
    KAPPA_CONFIG_FIELD(
        trainer.seed,
        "Seed of the RL phase alone (prompt order, worker sampling, K_DR position sampling); 0: "
        "the top-level `seed`. Varying it keeps the dataset and the bootstrap checkpoints."),
    KAPPA_CONFIG_FIELD(trainer.distill_gate,
                       "Which samples the distillation term sees: `none` (GRPO only), `all` "
                       "(naive hybrid) or `rstg` (negative zero-variance groups, see `rstg.*`)."),
    KAPPA_CONFIG_FIELD(trainer.balance,
                       "Gradient balancing: `[naive]`, or any of `m3_norm`, `m3_mask`, "
                       "`m3_project`, `m3_adapt` (`m3_norm` and `m3_adapt` exclude each other; "
                       "refused: `m3_norm` with `trainer.reward_weight: 0`, `m3_mask` with "
                       "`trainer.distill_gate: rstg`)."),
    KAPPA_CONFIG_FIELD(trainer.kappa_target,
                       "κ_target of `m3_norm` and `m3_adapt`: the ratio ‖g_R‖ / ‖scaled g_D‖ "
                       "they aim for, divided by λ under `m3_norm` (> 0)."),

    KAPPA_CONFIG_FIELD(m3.mask_target,
                       "`m3_mask`: the term dropped where K_DR < 0: `reward` or `distill`."),
    KAPPA_CONFIG_FIELD(m3.mask_estimator,
                       "`m3_mask`: the K_DR estimator it reads: `logit` or `last_layer` (same "
                       "sign; they differ in weight when the mask is soft)."),
    KAPPA_CONFIG_FIELD(
        m3.mask_temperature,
        "`m3_mask`: 0: a hard mask; τ > 0: weight σ(K_DR / τ) at conflicting positions."),
    KAPPA_CONFIG_FIELD(m3.adapt_gain, "`m3_adapt`: each step λ ← λ · (EMA κ_eff / κ_target)^gain."),
    KAPPA_CONFIG_FIELD(m3.adapt_ema, "`m3_adapt`: EMA coefficient of κ_eff."),
    KAPPA_CONFIG_FIELD(m3.adapt_max_factor,
                       "`m3_adapt`: each step's change of λ is bounded to [1/f, f]."),
    KAPPA_CONFIG_FIELD(m3.lambda_min, "`m3_adapt`: lower bound of λ."),
    KAPPA_CONFIG_FIELD(m3.lambda_max, "`m3_adapt`: upper bound of λ."),

    KAPPA_CONFIG_FIELD(rstg.confidence,
                       "Weight of a gated sample, the teacher's confidence: `max_prob` (mean_t "
                       "max_v q) or `token_prob` (exp(mean_t log q(y_t)))."),
    KAPPA_CONFIG_FIELD(rstg.token_selector,
                       "Which gated positions are distilled: the top ones by `entropy` (the "
                       "student's), by `divergence` (ℓ_D(n)), or `union`: the top ones by "
                       "either (the RSTG paper's high entropy or large divergence)."),
    KAPPA_CONFIG_FIELD(rstg.token_frac,
                       "Keep the top fraction (rounded up) of the gated positions by "
                       "`token_selector`; in (0, 1]."),
    KAPPA_CONFIG_FIELD(rstg.entropy_threshold,
                       "≥ 0 with `token_selector: entropy`: keep every position with H(p_n) ≥ "
                       "this instead of `token_frac`; < 0: off."),
    KAPPA_CONFIG_FIELD(rstg.divergence_threshold,
                       "≥ 0 with `token_selector: divergence`: keep every position with ℓ_D(n) ≥ "
                       "this instead of `token_frac`; < 0: off."),
    KAPPA_CONFIG_FIELD(rstg.teacher_samples,
                       "Teacher SFT: K teacher responses generated and verified per negative "
                       "zero-variance prompt; 0: no teacher SFT."),
    KAPPA_CONFIG_FIELD(rstg.teacher_temperature,
                       "Teacher SFT: sampling temperature of those teacher responses."),
    KAPPA_CONFIG_FIELD(rstg.sft_weight,
                       "Teacher SFT: μ, the weight of the NLL of the verified-correct teacher "
                       "responses; 0: no teacher SFT."),

    KAPPA_CONFIG_FIELD(
        monitor.kappa_every,
        "Steps between κ measurements (separate L_R and L_D backward passes); 0: never. The "
        "balancers that need both gradients measure every step anyway."),
    KAPPA_CONFIG_FIELD(monitor.kdr_every, "Steps between cheap K_DR measurements; 0: never."),
    KAPPA_CONFIG_FIELD(monitor.kdr_estimator,
                       "The estimator the K_DR statistics use: `last_layer` or `logit`."),
    KAPPA_CONFIG_FIELD(monitor.kdr_exact_every,
                       "Opt-in: steps between exact (autograd) K_DR samples; 0: never."),
    KAPPA_CONFIG_FIELD(monitor.kdr_exact_positions, "Positions per exact K_DR sample."),
    KAPPA_CONFIG_FIELD(monitor.atlas_positions,
                       "The conflict atlas: per step, this many positions with the most "
                       "negative K_DR (K_DR < 0 only) go to `conflict_atlas.jsonl` with the "
                       "prompt, the response, the sampled token, the teacher's preferred "
                       "tokens, the advantage and the reward (`kappa report` shows them); 0: "
                       "off."),

    KAPPA_CONFIG_FIELD(alarms.kappa_threshold,
                       "magnitude_drowning fires when the EMA of the applied ratio κ_eff = κ/λ "
                       "is above this while L_D rises (`slope_window`, `min_relative_rise`)."),
    KAPPA_CONFIG_FIELD(alarms.ema_alpha, "EMA coefficient of κ, reward, L_D and entropy."),
    KAPPA_CONFIG_FIELD(alarms.slope_window,
                       "magnitude_drowning: L_D rises when its EMA is higher than this many "
                       "steps ago by more than `min_relative_rise`."),
    KAPPA_CONFIG_FIELD(alarms.min_relative_rise,
                       "magnitude_drowning: the least rise of the L_D EMA over `slope_window` "
                       "steps, as a fraction of its value then."),
    KAPPA_CONFIG_FIELD(alarms.conflict_threshold,
                       "directional_conflict fires when the |K_DR|-weighted negative fraction is "
                       "above this for `conflict_window` steps running."),
    KAPPA_CONFIG_FIELD(
        alarms.conflict_window,
        "directional_conflict: steps running above `conflict_threshold` before it fires."),
    KAPPA_CONFIG_FIELD(alarms.collapse_window,
                       "collapse fires when the reward, L_D or entropy EMA is past its bound "
                       "(the three keys below) for this many steps running."),
    KAPPA_CONFIG_FIELD(alarms.reward_drop_ratio,
                       "collapse: reward EMA below this × its best (and `reward_drop_min` below "
                       "it)."),
    KAPPA_CONFIG_FIELD(alarms.reward_drop_min,
                       "collapse: the reward EMA's fall below its best must also be at least this "
                       "(reward units): a halved small reward is noise, not a collapse "
                       "(docs/algorithms.md §3.3)."),
    KAPPA_CONFIG_FIELD(alarms.distill_rise_factor, "collapse: L_D EMA above this × its minimum."),
    KAPPA_CONFIG_FIELD(alarms.entropy_floor, "collapse: entropy EMA below this (nats)."),
    KAPPA_CONFIG_FIELD(alarms.warmup_steps, "No alarm fires in the first this-many observations."),
    KAPPA_CONFIG_FIELD(
        alarms.clear_steps,
        "An active alarm clears once its condition has been false for this many steps running."),
    KAPPA_CONFIG_FIELD(alarms.mismatch_threshold,
                       "inference_mismatch fires when the mean |log π_learner − log π_behaviour| "
                       "on tokens sampled with the current version is above this."),

    KAPPA_CONFIG_FIELD(logging.tensorboard,
                       "Write a TensorBoard event file into the run directory "
                       "(`events.out.tfevents.*`): every scalar of every metrics.jsonl record, "
                       "tagged by its key (`alarm_active/collapse`), so `tensorboard --logdir "
                       "runs/` compares runs and an experiment's arms."),

    KAPPA_CONFIG_FIELD(
        plan.host_memory_bytes,
        "Host memory the run's processes must fit in, bytes; 0: detect "
        "(MemAvailable, or the cgroup's memory.max less its usage when lower). `kappa run` "
        "refuses a plan above 0.9 × this."),
    KAPPA_CONFIG_FIELD(plan.device_memory_bytes,
                       "Memory of each GPU the plan places processes on, bytes; 0: detect (its "
                       "free memory, CUDA builds only; otherwise unchecked)."),
    KAPPA_CONFIG_FIELD(plan.prompt_tokens,
                       "The longest prompt in tokens that the plan sizes sequences for; 0: "
                       "render and tokenize every train and held-out prompt."),
};

#undef KAPPA_MODEL_ROLE_FIELDS
#undef KAPPA_CONFIG_FIELD

// The table above, for the functions below.
absl::Span<const Field> Fields() { return kFields; }

const Field* FindField(const std::string& key) {
  for (const Field& field : Fields()) {
    if (key == field.key) return &field;
  }
  return nullptr;
}

// True if `key` is a section ("trainer", "student.shape") of some field.
bool IsSection(const std::string& key) {
  const std::string prefix = key + ".";
  for (const Field& field : Fields()) {
    if (std::string(field.key).rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// What a field expects, for messages.
struct Expectation {
  std::string operator()(int64_t*) const { return "an integer"; }
  std::string operator()(uint64_t*) const { return "a non-negative integer"; }
  std::string operator()(double*) const { return "a finite number"; }
  std::string operator()(bool*) const { return "a boolean"; }
  std::string operator()(std::string*) const { return "a string"; }
  std::string operator()(StringList*) const { return "a list of names"; }
  std::string operator()(const ChoiceRef& choice) const {
    return absl::StrCat("one of ", JoinNames(choice.names, choice.count));
  }
  std::string operator()(const ChoiceListRef& choice) const {
    return absl::StrCat("a list of ", JoinNames(choice.names, choice.count));
  }
};

// Parses `text` into the field; false if it does not have the field's type.
struct Assign {
  const std::string& text;
  bool operator()(int64_t* out) const { return absl::SimpleAtoi(text, out); }
  bool operator()(uint64_t* out) const {
    return text.find('-') == std::string::npos && absl::SimpleAtoi(text, out);
  }
  bool operator()(double* out) const {
    double value = 0;
    if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) return false;
    *out = value;
    return true;
  }
  bool operator()(bool* out) const {
    // YAML 1.1 spellings, which yaml-cpp also uses.
    for (const char* yes : {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"}) {
      if (text == yes) return *out = true, true;
    }
    for (const char* no : {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"}) {
      if (text == no) return *out = false, true;
    }
    return false;
  }
  bool operator()(std::string* out) const {
    *out = text;
    return true;
  }
  // A scalar list value: "a" or "a,b" (the override form of [a, b]).
  bool operator()(StringList* out) const {
    out->clear();
    for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
      out->push_back(std::string(absl::StripAsciiWhitespace(part)));
    }
    return true;
  }
  bool operator()(const ChoiceRef& choice) const {
    const size_t index = FindName(choice.names, choice.count, text);
    if (index == choice.count) return false;
    choice.write(choice.member, index);
    return true;
  }
  bool operator()(const ChoiceListRef& choice) const {
    StringList names;
    (*this)(&names);
    return AssignChoiceList(choice, names);
  }
  // Every one of `names` a spelling of the choice; nothing written otherwise.
  static bool AssignChoiceList(const ChoiceListRef& choice, const StringList& names) {
    std::vector<size_t> indices;
    for (const std::string& name : names) {
      indices.push_back(FindName(choice.names, choice.count, name));
      if (indices.back() == choice.count) return false;
    }
    choice.write(choice.member, indices);
    return true;
  }
};

// Shortest decimal text that parses back to exactly `value`.
std::string FormatDouble(double value) {
  char buffer[64];
  for (int precision : {15, 16, 17}) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    double parsed = 0;
    if (absl::SimpleAtod(buffer, &parsed) && parsed == value) break;
  }
  std::string text = buffer;
  // Keep it visibly a number of the right kind ("1" would read as an integer).
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

struct Format {
  std::string operator()(int64_t* value) const { return absl::StrCat(*value); }
  std::string operator()(uint64_t* value) const { return absl::StrCat(*value); }
  std::string operator()(double* value) const { return FormatDouble(*value); }
  std::string operator()(bool* value) const { return *value ? "true" : "false"; }
  std::string operator()(std::string* value) const { return *value; }
  std::string operator()(StringList* value) const { return absl::StrJoin(*value, ","); }
  std::string operator()(const ChoiceRef& choice) const {
    return choice.names[choice.read(choice.member)];
  }
  std::string operator()(const ChoiceListRef& choice) const {
    return absl::StrJoin(Names(choice), ",");
  }
  static StringList Names(const ChoiceListRef& choice) {
    StringList names;
    for (size_t index : choice.read(choice.member)) names.push_back(choice.names[index]);
    return names;
  }
};

// The reference's type column.
struct TypeName {
  std::string operator()(int64_t*) const { return "integer"; }
  std::string operator()(uint64_t*) const { return "non-negative integer"; }
  std::string operator()(double*) const { return "number"; }
  std::string operator()(bool*) const { return "boolean"; }
  std::string operator()(std::string*) const { return "string"; }
  std::string operator()(StringList*) const { return "list of names"; }
  std::string operator()(const ChoiceRef& choice) const {
    return absl::StrCat("one of ", JoinNames(choice.names, choice.count, "`"));
  }
  std::string operator()(const ChoiceListRef& choice) const {
    return absl::StrCat("list of ", JoinNames(choice.names, choice.count, "`"));
  }
};

// A Markdown table cell: a '|' would end the cell.
std::string Cell(absl::string_view text) { return absl::StrReplaceAll(text, {{"|", "\\|"}}); }

// The reference's default column: the value as ConfigToYaml writes it, in code
// font; "" for an empty string, [a, b] for a list.
std::string DefaultCell(const FieldRef& ref) {
  if (const auto* list = std::get_if<StringList*>(&ref)) {
    return Cell(absl::StrCat("`[", absl::StrJoin(**list, ", "), "]`"));
  }
  if (const auto* choices = std::get_if<ChoiceListRef>(&ref)) {
    return Cell(absl::StrCat("`[", absl::StrJoin(Format::Names(*choices), ", "), "]`"));
  }
  const std::string text = std::visit(Format{}, ref);
  return Cell(text.empty() ? "`\"\"`" : absl::StrCat("`", text, "`"));
}

// The top-level section of a key: "trainer" for "trainer.steps", "run" for
// the keys without one.
std::string SectionOf(absl::string_view key) {
  const size_t dot = key.find('.');
  return dot == absl::string_view::npos ? "run" : std::string(key.substr(0, dot));
}

// One line under each section's heading (links are relative to docs/).
const char* SectionIntro(const std::string& section) {
  static const std::map<std::string, const char*> kIntros = {
      {"run",
       "The keys at the top level: the run's name and directories, its seed, and the "
       "processes `kappa run` starts."},
      {"task",
       "The dataset, and how a prompt becomes the model's input "
       "([tokenizers.md](tokenizers.md#chat-templates-and-prompts))."},
      {"student",
       "The model being trained: a Hugging Face checkpoint ([models.md](models.md)), or "
       "the shape and SFT recipe of the bootstrap warm start; with `lora.rank` > 0, the "
       "LoRA adapters trained on it ([models.md](models.md#lora-adapters))."},
      {"teacher",
       "The teacher server: its checkpoint or bootstrap, dtype, device and dynamic "
       "batching."},
      {"verifier", "The verifier server."},
      {"learner",
       "The learner: leases, the bounded buffer, staleness, its device and the "
       "data-parallel ranks ([scaling.md](scaling.md#6-multi-gpu-learner))."},
      {"security",
       "Transport security of every gRPC server and channel "
       "([security.md](security.md)); off by default, since the demo runs on "
       "loopback."},
      {"rollout", "The rollout workers: sampling, their device, stop strings."},
      {"trainer",
       "The training step: the losses and their weights, the optimizer, evaluation "
       "and checkpoints ([running.md](running.md#the-training-step), "
       "[algorithms.md](algorithms.md))."},
      {"m3", "The M3 gradient balancers that `trainer.balance` names."},
      {"rstg", "The RSTG distillation gate (`trainer.distill_gate: rstg`)."},
      {"monitor", "How often κ and K_DR are measured."},
      {"logging",
       "What the learner writes besides metrics.jsonl "
       "([metrics.md](metrics.md#tensorboard))."},
      {"plan",
       "The memory plan `kappa plan` prints and `kappa run` checks before it starts "
       "anything ([running.md](running.md#memory-plan-kappa-plan))."},
      {"alarms",
       "The learner's three alarms; `deploy/prometheus/rules.yml` mirrors these "
       "defaults ([metrics.md](metrics.md))."},
  };
  const auto it = kIntros.find(section);
  return it == kIntros.end() ? "" : it->second;
}

const char* NodeKind(const YAML::Node& node) {
  if (node.IsMap()) return "a mapping";
  if (node.IsSequence()) return "a sequence";
  if (node.IsNull()) return "nothing";
  return "a scalar";
}

// Text a value may hold: UTF-8 (YAML is Unicode text) without a carriage
// return. Either would not come back the same through ConfigToYaml ->
// ParseConfig, which `kappa run --resume` relies on: the emitter escapes
// invalid bytes into text that no longer parses, and writes a trailing CR
// unquoted, where it reads back as a line break. The message gives the
// byte's offset, not the bytes.
absl::Status CheckText(const Field& field, const std::string& text, const std::string& where) {
  const size_t bad = base::FirstInvalidUtf8(text);
  if (bad != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": key '", field.key, "' is not valid UTF-8 (byte ", bad, " of its value)"));
  }
  const size_t cr = text.find('\r');
  if (cr != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": key '", field.key, "' holds a carriage return (byte ", cr, " of its value)"));
  }
  return absl::OkStatus();
}

// Assigns a YAML value to a field; `where` prefixes messages ("<file>:<line>"
// or "override 'k=v'"). A null value means the empty string for strings.
// Every scalar read passes CheckText before it is used or quoted back.
absl::Status AssignNode(const Field& field, const YAML::Node& value, const std::string& where,
                        Config* config) {
  const FieldRef ref = field.get(*config);
  std::string problem;
  if (value.IsScalar()) {
    KAPPA_RETURN_IF_ERROR(CheckText(field, value.Scalar(), where));
    if (std::visit(Assign{value.Scalar()}, ref)) return absl::OkStatus();
    problem = absl::StrCat("'", value.Scalar(), "'");
  } else if (value.IsNull() && std::holds_alternative<std::string*>(ref)) {
    std::get<std::string*>(ref)->clear();
    return absl::OkStatus();
  } else if (value.IsSequence() && (std::holds_alternative<StringList*>(ref) ||
                                    std::holds_alternative<ChoiceListRef>(ref))) {
    StringList list;
    for (const YAML::Node& item : value) {
      if (!item.IsScalar()) {
        problem = absl::StrCat("a sequence holding ", NodeKind(item));
        break;
      }
      KAPPA_RETURN_IF_ERROR(CheckText(field, item.Scalar(), where));
      list.push_back(item.Scalar());
    }
    if (problem.empty()) {
      if (const auto* choice = std::get_if<ChoiceListRef>(&ref)) {
        if (Assign::AssignChoiceList(*choice, list)) return absl::OkStatus();
        problem = absl::StrCat("[", absl::StrJoin(list, ", "), "]");
      } else {
        *std::get<StringList*>(ref) = std::move(list);
        return absl::OkStatus();
      }
    }
  } else {
    problem = NodeKind(value);
  }
  return absl::InvalidArgumentError(absl::StrCat(where, ": key '", field.key, "' expects ",
                                                 std::visit(Expectation{}, ref), ", got ",
                                                 problem));
}

int LineOf(const YAML::Node& node, const YAML::Node& fallback) {
  const int line = node.Mark().line >= 0 ? node.Mark().line : fallback.Mark().line;
  return line + 1;  // yaml-cpp counts from 0
}

absl::Status ApplyMapping(const YAML::Node& mapping, const std::string& prefix,
                          const std::string& file_name, std::set<std::string>* seen,
                          Config* config) {
  for (auto it = mapping.begin(); it != mapping.end(); ++it) {
    const YAML::Node key_node = it->first;  // copies: the iterator yields a temporary
    const YAML::Node value = it->second;
    const std::string where = absl::StrCat(file_name, ":", LineOf(key_node, mapping));
    if (!key_node.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": keys must be plain names"));
    }
    const std::string key =
        prefix.empty() ? key_node.Scalar() : absl::StrCat(prefix, ".", key_node.Scalar());
    if (!seen->insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate key '", key, "'"));
    }
    if (const Field* field = FindField(key)) {
      absl::Status status = AssignNode(
          *field, value,
          absl::StrCat(file_name, ":",
                       value.IsNull() ? LineOf(key_node, mapping) : LineOf(value, key_node)),
          config);
      if (!status.ok()) return status;
    } else if (IsSection(key)) {
      if (value.IsNull()) continue;  // "trainer:" with nothing below
      if (!value.IsMap()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": key '", key, "' is a section and expects a mapping, got ", NodeKind(value)));
      }
      absl::Status status = ApplyMapping(value, key, file_name, seen, config);
      if (!status.ok()) return status;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key '", key, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyOverride(const std::string& text, Config* config) {
  const std::string where = absl::StrCat("override '", text, "'");
  const size_t equals = text.find('=');
  if (equals == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected key=value"));
  }
  const std::string key = text.substr(0, equals);
  const std::string value_text = text.substr(equals + 1);
  const Field* field = FindField(key);
  if (field == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key '", key, "'"));
  }
  // The value reads as a YAML scalar (so quotes work: name='my run'); text
  // that is not valid YAML on its own, like "*", is taken literally.
  YAML::Node value;
  try {
    value = YAML::Load(value_text);
  } catch (const YAML::Exception&) {
    value = YAML::Node(value_text);
  }
  return AssignNode(*field, value, where, config);
}

}  // namespace

absl::StatusOr<Config> ParseConfig(const std::string& yaml_text, const std::string& file_name,
                                   const std::vector<std::string>& overrides) {
  Config config;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ":", e.mark.line + 1, ": invalid YAML: ", e.msg));
  }
  if (root.IsMap()) {
    std::set<std::string> seen;
    absl::Status status = ApplyMapping(root, "", file_name, &seen, &config);
    if (!status.ok()) return status;
  } else if (!root.IsNull()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file_name, ":", LineOf(root, root), ": expected a mapping of keys, got ", NodeKind(root)));
  }
  for (const std::string& override_text : overrides) {
    absl::Status status = ApplyOverride(override_text, &config);
    if (!status.ok()) return status;
  }
  return config;
}

absl::StatusOr<Config> LoadConfig(const std::string& path,
                                  const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open config file"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str(), path, overrides);
}

absl::StatusOr<std::vector<std::string>> WithEnvironmentOverrides(
    const std::vector<std::string>& overrides, const char* const* environment) {
  constexpr absl::string_view kPrefix = "KAPPA_CFG_";
  std::map<std::string, std::string> by_variable;  // sorted: a stable order
  for (const char* const* entry = environment; entry != nullptr && *entry != nullptr; ++entry) {
    const absl::string_view text = *entry;
    const size_t equals = text.find('=');
    if (!absl::StartsWith(text, kPrefix) || equals == absl::string_view::npos) continue;
    const std::string variable(text.substr(0, equals));
    std::string key = absl::AsciiStrToLower(variable.substr(kPrefix.size()));
    key = absl::StrReplaceAll(key, {{"__", "."}});
    const std::string override_text = absl::StrCat(key, "=", text.substr(equals + 1));
    // Checked alone against the defaults so the message names the variable.
    if (absl::StatusOr<Config> alone = ParseConfig("", "<environment>", {override_text});
        !alone.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", variable, ": ", alone.status().message()));
    }
    by_variable[variable] = override_text;
  }
  std::vector<std::string> all;
  for (const auto& [variable, override_text] : by_variable) all.push_back(override_text);
  all.insert(all.end(), overrides.begin(), overrides.end());
  return all;
}

std::vector<std::string> ConfigKeys() {
  std::vector<std::string> keys;
  for (const Field& field : Fields()) keys.push_back(field.key);
  return keys;
}

std::string ConfigToYaml(const Config& config) {
  // Fields() hands out mutable references; nothing below writes through them.
  Config& readable = const_cast<Config&>(config);
  YAML::Node root(YAML::NodeType::Map);
  for (const Field& field : Fields()) {
    const std::vector<std::string> parts = absl::StrSplit(field.key, '.');
    YAML::Node node = root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      YAML::Node child = node[parts[i]];
      node.reset(child);  // re-seat, not assign: assignment would overwrite
    }
    const FieldRef ref = field.get(readable);
    if (std::holds_alternative<StringList*>(ref) || std::holds_alternative<ChoiceListRef>(ref)) {
      const StringList items = std::holds_alternative<StringList*>(ref)
                                   ? *std::get<StringList*>(ref)
                                   : Format::Names(std::get<ChoiceListRef>(ref));
      YAML::Node sequence(YAML::NodeType::Sequence);
      for (const std::string& item : items) sequence.push_back(item);
      node[parts.back()] = sequence;
    } else {
      node[parts.back()] = std::visit(Format{}, ref);
    }
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

std::string ConfigKeyDescription(const std::string& key) {
  const Field* field = FindField(key);
  return field == nullptr ? "" : field->description;
}

std::string ConfigReferenceMarkdown() {
  std::string out =
      "# Configuration reference\n"
      "\n"
      "<!-- Generated by `kappa config-reference`; do not edit by hand. -->\n"
      "\n"
      "This page is generated from the key table in `services/config.cc` (`Fields()`: each "
      "key and its description) and the defaults of a default-constructed `services::Config` "
      "(`services/config.h`). Do not edit it by hand; after changing a key, its default or its "
      "description, regenerate it with\n"
      "\n"
      "    build/cli/kappa config-reference > docs/configuration.md\n"
      "\n"
      "ctest `services_config_reference_test` fails while it is out of date.\n"
      "\n"
      "A run's configuration is a YAML file (`configs/demo.yaml`) plus `key=value` overrides "
      "on the command line (`kappa run configs/demo.yaml trainer.steps=20 workers=3`) and, for "
      "containers that share one mounted file, environment variables "
      "`KAPPA_CFG_<SECTION>__<KEY>=value` (`KAPPA_CFG_TRAINER__STEPS=500`); the command line "
      "wins over the environment, the environment over the file. Every key has the default "
      "below. An unknown key or a value of the wrong type is an error naming the file, the "
      "line and the key; a bad value of a training key (`trainer.*`, `m3.*`, `rstg.*`, "
      "`monitor.*`, `alarms.*`) is refused by `kappa run` before it starts a process. "
      "`kappa run` writes the resolved configuration, every key included, to "
      "`runs/<name>/config.yaml`.\n"
      "\n"
      "Types: an integer; a non-negative integer; a number (finite); a boolean (`true` or "
      "`false`; YAML 1.1's `yes`/`no`/`on`/`off` too); a string; a list of names (a YAML list, "
      "or `a,b` in an override); one of the names listed (a named choice, refused at load "
      "when it is none of them), or a list of them.\n";
  Config defaults;
  std::string section;
  for (const Field& field : Fields()) {
    if (const std::string next = SectionOf(field.key); next != section) {
      section = next;
      absl::StrAppend(&out, "\n## ", section, "\n\n");
      if (const std::string intro = SectionIntro(section); !intro.empty()) {
        absl::StrAppend(&out, intro, "\n\n");
      }
      absl::StrAppend(&out, "| key | type | default | description |\n|---|---|---|---|\n");
    }
    const FieldRef ref = field.get(defaults);
    absl::StrAppend(&out, "| `", field.key, "` | ", std::visit(TypeName{}, ref), " | ",
                    DefaultCell(ref), " | ", Cell(field.description), " |\n");
  }
  return out;
}

}  // namespace kappa::services
