#include "cli/memory_plan.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kappa::cli {
namespace {

// Resident size of each binary with a negligible model: the peak RSS it
// logged at exit (services/logging.h, VmHWM) in a 2-step `kappa run` of
// tests/integration/tiny_run_config.h's config (d 32, 1 layer, the
// character tokenizer's 51-row vocabulary, 2 groups × 4 per step; every
// model and batch term of the plan below 1 MiB in all), on the 2-core CPU
// development machine, 2026-12-05, three runs: learner 181/182/182 MiB,
// workers 163–177 MiB, teacher 175/176/176 MiB, verifier 17 MiB each time
// (and 18 MiB sampled under the load of issue 38's 0.5B run). That is
// libtorch's and gRPC's shared libraries, the allocators' arenas and the
// threads' stacks; the verifier does not link libtorch. A CUDA build's
// context adds host memory the plan does not count.
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kBaseLearner = 182 * kMiB;
constexpr int64_t kBaseRolloutWorker = 178 * kMiB;
constexpr int64_t kBaseTeacher = 176 * kMiB;
constexpr int64_t kBaseVerifier = 17 * kMiB;

// model::DecodeEngine's prefill takes prompts up to this many tokens at
// once (model/decode_engine.cc kMaxPrefillTokens).
constexpr int64_t kMaxPrefillTokens = 8192;
// learner/dataset_accuracy.cc: the held-out prompts are decoded 256 at a time.
constexpr int64_t kEvalBatch = 256;
// Live [positions, V] float32 tensors of the vocabulary head in one
// backward (logits, log-probs, their gradients, the loss terms' per-token
// temporaries): 5.9 measured at 4 and 8 × 512 with chunks of 512
// (bench/README.md "Learner step at a real vocabulary"; unchunked about 6.5).
constexpr int64_t kHeadTensors = 6;

std::string DeviceOf(const std::string& device) {
  if (device.empty() || device == "cpu") return "host";
  if (device == "cuda") return "cuda:0";
  return device;
}

// A data-parallel rank's device: "cuda" takes rank mod the visible GPUs
// (learner/data_parallel_setup.h RankCudaIndex); the plan cannot see them,
// so rank r is charged to cuda:r. cuda:N and cpu are taken as given.
std::string RankDevice(const std::string& device, int64_t rank, int64_t world) {
  if (device == "cuda" && world > 1) return absl::StrCat("cuda:", rank);
  return DeviceOf(device);
}

int64_t ValueBytes(const services::Config& config) {
  return config.trainer.teacher_values == services::Precision::kBFloat16 ? 2 : 4;
}

// Bytes of one response position's teacher row on the wire (ScoredSample /
// ScoredSequence): full [V] values, top-k values + int32 ids + the float32
// tail, the one sampled value, or the teacher's D_t hidden values.
int64_t WireRowBytes(const PlanInputs& in) {
  const int64_t v = ValueBytes(in.config);
  switch (in.teacher_rows) {
    case TeacherRows::kHidden:
      return in.teacher.hidden * v;
    case TeacherRows::kFull:
      return in.teacher.vocab * v;
    case TeacherRows::kTopK:
      return in.config.trainer.distill_topk * (v + 4) + 4;
    case TeacherRows::kSampled:
      return v;
    case TeacherRows::kNone:
      return 0;
  }
  return 0;
}

// The learner's batch keeps teacher rows as float32 values, int64 ids and
// the float32 tail per position (tests: teacher_bytes = B·L·(12k + 4));
// hidden rows stay in their wire dtype.
int64_t BatchRowBytes(const PlanInputs& in) {
  switch (in.teacher_rows) {
    case TeacherRows::kHidden:
      return in.teacher.hidden * ValueBytes(in.config);
    case TeacherRows::kFull:
      return in.teacher.vocab * 4;
    case TeacherRows::kTopK:
      return in.config.trainer.distill_topk * 12 + 4;
    case TeacherRows::kSampled:
      return 4;
    case TeacherRows::kNone:
      return 0;
  }
  return 0;
}

// Upper bounds of the two largest messages. Per response token of a
// ScoredSample: the teacher row, the float32 behaviour log-prob, the token
// id (a varint of at most 5 bytes) and its text (8 bytes, an estimate: the
// tokenizers' tokens are a few characters); 64 bytes of framing per sample.
int64_t ScoredGroupBytes(const PlanInputs& in) {
  const int64_t g = in.config.trainer.group_size;
  const int64_t t = in.config.rollout.max_new_tokens;
  return g * (t * (WireRowBytes(in) + 4 + 5 + 8) + 64) + in.prompt_tokens * 5 + 256;
}
int64_t ScoreResponseBytes(const PlanInputs& in) {
  const int64_t g = in.config.trainer.group_size;
  const int64_t t = in.config.rollout.max_new_tokens;
  return g * (t * WireRowBytes(in) + 64) + 16;
}

bool NeedsSeparateGradients(const services::Config& config) {
  // learner/algo/hybrid_step.cc BeginStep: κ due, or a balancer that needs
  // ∇L_R and ∇L_D apart (m3_project, m3_norm, m3_adapt).
  const bool kappa = config.monitor.kappa_every > 0 &&
                     config.monitor.kappa_every <= std::max<int64_t>(config.trainer.steps, 1);
  using services::BalanceMethod;
  for (BalanceMethod b : config.trainer.balance) {
    if (b == BalanceMethod::kM3Project || b == BalanceMethod::kM3Norm ||
        b == BalanceMethod::kM3Adapt) {
      return true;
    }
  }
  return kappa;
}

// student.lora: the learner trains adapters on frozen weights.
bool TrainsAdapters(const services::Config& config) { return config.student.lora.rank > 0; }

// learner/main.cc StartServing: the publisher keeps the previous version as
// a delta base with rollout.weight_delta, and always with student.lora.
bool KeepsDeltaBases(const services::Config& config) {
  return config.rollout.weight_delta || TrainsAdapters(config);
}

// Under `kappa run` every worker shares the learner's host, so `auto`
// means shared memory (learner/shm_policy.h): a segment of every weight
// per version, never a delta.
bool SyncsThroughSharedMemory(const services::Config& config) {
  return config.rollout.weight_transport == services::WeightTransport::kShm ||
         config.rollout.weight_transport == services::WeightTransport::kAuto;
}

// A worker offers its version as a delta base only when its weights give
// back the wire bytes exactly: the same dtype, or a bfloat16 wire into
// float32 weights (rollout_worker/policy_watcher.cc ReproducesWireBytes).
bool WorkersTakeDeltas(const PlanInputs& in) {
  return in.wire_bytes == in.worker_weight_bytes ||
         (in.wire_bytes == 2 && in.worker_weight_bytes == 4);
}

// The [out, in] weight of a decoder layer's projection by its Hugging Face
// name (model/transformer.h); {0, 0} for any other name.
struct ProjectionShape {
  int64_t out = 0;
  int64_t in = 0;
};
ProjectionShape ProjectionNamed(const ModelDims& d, const std::string& name) {
  const int64_t q = d.heads * d.head_dim, kv = d.kv_heads * d.head_dim;
  if (name == "q_proj") return {q, d.hidden};
  if (name == "k_proj" || name == "v_proj") return {kv, d.hidden};
  if (name == "o_proj") return {d.hidden, q};
  if (name == "gate_proj" || name == "up_proj") return {d.intermediate, d.hidden};
  if (name == "down_proj") return {d.hidden, d.intermediate};
  return {};
}

class Terms {
 public:
  explicit Terms(ProcessPlan& process) : process_(process) {}
  void Add(std::string name, const std::string& device, int64_t bytes, std::string key,
           std::string formula) {
    if (bytes <= 0) return;
    process_.terms.push_back({std::move(name), device, bytes, std::move(key), std::move(formula)});
  }

 private:
  ProcessPlan& process_;
};

// What every term of a learner rank's plan is computed from: the run's
// config and models, and the step's shape on this rank.
struct LearnerShape {
  LearnerShape(const PlanInputs& in, int64_t world) : in(in), c(in.config), s(in.student) {
    n = s.Parameters();
    v = s.vocab;
    d = s.hidden;
    f = s.intermediate;
    layers = s.layers;
    batch = std::max<int64_t>(
        1, c.trainer.groups_per_step * c.trainer.group_size / std::max<int64_t>(world, 1));
    micro = c.trainer.micro_batch_sequences > 0 ? std::min(c.trainer.micro_batch_sequences, batch)
                                                : batch;
    t = c.rollout.max_new_tokens;
    positions = in.prompt_tokens + t - 1;  // a row: prompt + response − 1
    ckpt = c.trainer.activation_checkpointing;
    bf16 = c.trainer.precision == services::Precision::kBFloat16;
    distill = in.teacher_rows != TeacherRows::kNone;
    separate = NeedsSeparateGradients(c);
    // With student.lora the trained parameters are the adapters' N_a
    // (learner/student_lora.h); every student weight stays float32 and frozen.
    lora = TrainsAdapters(c);
    adapters = s.AdapterParameters(c.student.lora);
    trained = lora ? adapters : n;
    chunk = c.trainer.vocab_chunk_positions;
    head_rows = chunk > 0 ? std::min(chunk, micro * t) : micro * positions;
    cuda = absl::StartsWith(c.learner.device, "cuda");
    row_blocks = chunk > 0 && c.trainer.fused_head && !cuda;
  }

  const PlanInputs& in;
  const services::Config& c;
  const ModelDims& s;
  int64_t n, v, d, f, layers;
  int64_t batch, micro;  // sequences on this rank per step, per micro-batch
  int64_t t, positions;  // response tokens, positions per row
  bool ckpt, bf16, distill, separate;
  bool lora;
  int64_t adapters, trained;
  int64_t chunk, head_rows;
  bool cuda, row_blocks;
};

// The trained parameters' state: weights, gradients, AdamW's moments.
void AddTrainedState(const LearnerShape& x, int64_t world, const std::string& dev, Terms& terms) {
  const services::Config& c = x.c;
  const int64_t n = x.n, v = x.v, d = x.d, adapters = x.adapters, trained = x.trained;
  const int64_t micro = x.micro, batch = x.batch;
  const bool lora = x.lora, separate = x.separate, distill = x.distill, bf16 = x.bf16,
             ckpt = x.ckpt;
  // learner/algo/optimizer_step.cc: fp32 parameters, the flat gradient that
  // .grad views, one more flat buffer per separately measured signal
  // (AttachGradients, kept once made), AdamW's two moments, all over the
  // parameters that require gradients. With student.lora those are the
  // adapters' N_a (learner/student_lora.h); every student weight stays
  // float32 and frozen.
  if (lora) {
    terms.Add("frozen weights (fp32)", dev, 4 * n, "", "4·N (every student weight: student.lora)");
    terms.Add("adapters (fp32 master)", dev, 4 * adapters, "student.lora.rank",
              "4·N_a, N_a = Σ layers Σ targets r·(in + out)");
  } else {
    terms.Add("weights (fp32 master)", dev, 4 * n, "", "4·N");
  }
  // learner.shard (learner/algo/sharded_adamw.h, optimizer_step.h): each
  // rank holds AdamW's moments of its slice of the padded flat vector and,
  // under "gradients", its segment of each signal's summed gradient, while
  // backward still writes one full buffer. Once sharded the key to change
  // is the world size; before, learner.shard.
  const bool shard_moments = c.learner.shard != services::LearnerShard::kNone && world > 1;
  const bool shard_gradients = c.learner.shard == services::LearnerShard::kGradients && world > 1;
  const int64_t segment = shard_moments ? (trained + world - 1) / world : trained;
  const std::string counted = lora ? "N_a" : "N";
  const std::string adapters_only = lora ? " (adapters only, student.lora)" : "";
  terms.Add("gradient", dev, 4 * trained, "",
            absl::StrCat("4·", counted, " (", lora ? "adapters only, student.lora; " : "",
                         shard_gradients ? "the buffer each backward pass writes, reduced over "
                                           "the ranks after it)"
                                         : "flat buffer; .grad views it)"));
  const bool distill_apart = separate && distill;
  const bool sft_apart = separate && c.trainer.distill_gate == services::DistillGate::kRstg &&
                         c.rstg.teacher_samples > 0 && c.rstg.sft_weight > 0;
  if (shard_gradients) {
    // This rank's segment of each signal's sum, but for the step's last
    // reduction with one micro-batch: that one is the buffer's own.
    const int64_t signals = 1 + (distill_apart ? 1 : 0) + (sft_apart ? 1 : 0);
    const bool one_round = micro >= batch;
    const int64_t owned = signals - (one_round ? 1 : 0);
    terms.Add(
        "summed gradient segments", dev, owned * 4 * segment, "learner.world_size",
        absl::StrCat(owned, "·4·⌈", counted, " / R⌉ (this rank's segment of each signal's sum",
                     one_round ? " but the last, the buffer's own" : "",
                     ": learner.shard: gradients, R = learner.world_size",
                     lora ? "; adapters only, student.lora)" : ")"));
  } else {
    if (distill_apart) {
      terms.Add("gradient of L_D apart (kappa, M3)", dev, 4 * trained, "monitor.kappa_every",
                absl::StrCat("4·", counted, adapters_only,
                             " while κ is measured or a balancer needs ∇L_D apart"));
    }
    if (sft_apart) {
      terms.Add("gradient of the teacher-SFT term apart", dev, 4 * trained, "rstg.sft_weight",
                absl::StrCat("4·", counted, adapters_only));
    }
  }
  terms.Add(
      "AdamW moments", dev, 8 * segment,
      shard_moments ? "learner.world_size" : (world > 1 ? "learner.shard" : ""),
      shard_moments
          ? absl::StrCat("8·⌈", counted, " / R⌉ (this rank's share: learner.shard: ",
                         std::string(services::ChoiceName(c.learner.shard)),
                         ", R = learner.world_size", lora ? "; adapters only, student.lora)" : ")")
          : absl::StrCat("8·", counted, adapters_only));
  if (bf16) {
    // Autocast's bfloat16 casts of the weights are saved for backward; under
    // checkpointing only the vocabulary head's outlives a layer.
    terms.Add("bf16 weight casts (autocast)", dev, ckpt ? 2 * v * d : 2 * n,
              ckpt ? "" : "trainer.activation_checkpointing",
              ckpt ? "2·V·d (the head's; layers recompute theirs)" : "2·N");
  }
}

// The layers' activations of one micro-batch.
void AddActivations(const LearnerShape& x, const std::string& dev, Terms& terms) {
  const ModelDims& s = x.s;
  const int64_t d = x.d, f = x.f, layers = x.layers, micro = x.micro, positions = x.positions;
  const bool bf16 = x.bf16, ckpt = x.ckpt;
  // Activations of one micro-batch: per layer and token the SwiGLU
  // intermediates (4 × f), the d-wide tensors (≈ 10 × d) and the explicit
  // attention scores and probabilities (≈ 2.5 × heads × positions), at 4
  // bytes (fp32) or ≈ 3 (bf16 autocast: matmul outputs bf16, softmax and
  // norms fp32). Calibrated on bench/README.md's 4-layer vocab-scale runs:
  // 0.55–0.65 GiB per layer per 4,096 tokens at 512 positions per row.
  const int64_t element = bf16 ? 3 : 4;
  const int64_t per_token = element * (4 * f + 10 * d + 5 * s.heads * positions / 2);
  const int64_t one_layer = micro * positions * per_token;
  if (ckpt) {
    terms.Add("activations", dev, layers * micro * positions * d * 4 + one_layer,
              "trainer.micro_batch_sequences",
              "checkpointed: L·m·S·d·4 (layer inputs) + one layer recomputed, m·S·e·(4f + 10d + "
              "2.5·h·S)");
  } else {
    terms.Add("activations", dev, layers * one_layer, "trainer.activation_checkpointing",
              "L·m·S·e·(4f + 10d + 2.5·h·S), m sequences of S positions per micro-batch");
  }
}

// The vocabulary head's tensors, and the teacher's head on the learner.
void AddVocabularyHead(const LearnerShape& x, const std::string& dev, Terms& terms) {
  const PlanInputs& in = x.in;
  const services::Config& c = x.c;
  const int64_t v = x.v, d = x.d, chunk = x.chunk, head_rows = x.head_rows;
  const bool separate = x.separate, distill = x.distill, lora = x.lora, cuda = x.cuda,
             row_blocks = x.row_blocks;
  // The vocabulary head: [rows, V] float32 tensors, rows = one chunk of
  // response positions or the micro-batch's every position, and the [V, d]
  // gradient of the output weight. The fused head on the CPU
  // (learner/algo/fused_head.cc) holds one chunk buffer (logits, then
  // ∂L/∂z in their place) and a second for ∂L_D/∂z when the two losses
  // keep their gradients apart, its per-position temporaries being [V]
  // per thread; and each such loss's [V, d] gradient from the forward to
  // its backward. The recomputing head, and the fused head on a GPU (one
  // block per chunk), hold kHeadTensors [rows, V] tensors at once.
  const int64_t head_tensors = row_blocks ? (separate && distill ? 2 : 1) : kHeadTensors;
  // With student.lora the output weight is frozen: no [V, d] gradient is
  // made (learner/algo/vocab_head.cc needs_input_grad; autograd unchunked).
  const bool head_grad = !lora;
  const int64_t weight_grads =
      head_grad ? (chunk > 0 && c.trainer.fused_head && separate && distill ? 2 : 1) : 0;
  terms.Add("vocab head", dev, head_tensors * head_rows * v * 4 + weight_grads * 4 * v * d,
            "trainer.vocab_chunk_positions",
            absl::StrCat(head_tensors, chunk > 0 ? "·min(c, m·T)·V·4" : "·m·S·V·4",
                         head_grad ? absl::StrCat(" + ", weight_grads, "·4·V·d")
                                   : " (frozen head: no weight gradient, student.lora)",
                         chunk > 0 ? "" : " (unchunked)",
                         row_blocks ? " (fused, a position at a time)" : ""));
  if (in.teacher_rows == TeacherRows::kHidden) {
    // learner/teacher_head_loader.h: the teacher's head, frozen, in the
    // teacher's dtype on the learner's device; each chunk rebuilds the
    // teacher's logits, and log q from them (a position at a time in the
    // fused head on the CPU; learner/algo/teacher_head.h).
    const services::ModelDtype dtype = c.teacher.dtype;
    const int64_t head_bytes =
        dtype == services::ModelDtype::kBFloat16 || (dtype == services::ModelDtype::kAuto && cuda)
            ? 2
            : 4;
    terms.Add("teacher head (teacher.rows: hidden)", dev,
              in.teacher.vocab * in.teacher.hidden * head_bytes +
                  (row_blocks ? head_rows * v * head_bytes : 2 * head_rows * v * 4),
              "teacher.rows",
              row_blocks ? "V·D_t·b (frozen) + min(c, m·T)·V·b (a chunk's teacher logits)"
                         : "V·D_t·b (frozen) + 2·min(c, m·T)·V·4 (a chunk's teacher logits, "
                           "log q)");
  }
}

// The teacher rows of the batch and the groups waiting for the next step.
void AddBatchAndBuffer(const LearnerShape& x, const std::string& dev, Terms& terms) {
  const PlanInputs& in = x.in;
  const services::Config& c = x.c;
  const int64_t v = x.v, t = x.t, batch = x.batch, micro = x.micro, positions = x.positions,
                chunk = x.chunk;
  const bool distill = x.distill;
  // Teacher rows: the batch's [B, L, row] (learner/algo/train_batch.h), the
  // decoded groups' [T, row] per sample, and with full rows and the chunked
  // head the [m·T, V] index_select of the micro-batch's response rows
  // (bench/README.md "Learner step at a real vocabulary").
  if (distill) {
    int64_t rows = batch * positions * BatchRowBytes(in) + batch * t * WireRowBytes(in);
    if (in.teacher_rows == TeacherRows::kFull && chunk > 0) rows += micro * t * v * 4;
    terms.Add(
        "teacher rows (batch)", dev, rows,
        in.teacher_rows == TeacherRows::kFull ? "trainer.distill_loss" : "trainer.distill_topk",
        "B·S·row + B·T·wire row (+ m·T·V·4 selected, full rows chunked)");
  }
  // learner.buffer_groups groups wait while the step runs, besides the
  // step's own groups_per_step.
  terms.Add("scored groups buffered", "host",
            (c.learner.buffer_groups + c.trainer.groups_per_step) * ScoredGroupBytes(in),
            "learner.buffer_groups", "(buffer_groups + groups_per_step) · ScoredGroup bytes");
}

// What publishing each version to the workers holds (host memory).
void AddPolicySync(const LearnerShape& x, Terms& terms) {
  const PlanInputs& in = x.in;
  const services::Config& c = x.c;
  const int64_t n = x.n, adapters = x.adapters, trained = x.trained;
  const bool lora = x.lora;
  // learner/trainer_loop.cc PublishPolicy: a deep copy per version in the
  // snapshot dtype (learner/policy_snapshot_dtype.h), taken while the
  // publisher still holds the previous one (and, keeping delta bases, the
  // one before). With student.lora the frozen weights are copied once and
  // every version shares them; a version copies its adapters only.
  const int64_t copies = 2 + (KeepsDeltaBases(c) ? 1 : 0);
  const int64_t sb = in.snapshot_bytes;
  const std::string snapshot_key = sb == 4 ? "rollout.weights_dtype" : "";
  if (lora) {
    terms.Add("policy snapshot of the frozen weights", "host", n * sb, snapshot_key,
              absl::StrCat("N·", sb, " (copied once, shared by every version: student.lora)"));
    terms.Add("policy snapshots", "host", copies * adapters * sb, snapshot_key,
              absl::StrCat(copies, "·N_a·", sb,
                           " (the adapters of the new version, the one streams still send, the "
                           "delta base)"));
  } else {
    terms.Add("policy snapshots", "host", copies * n * sb, snapshot_key,
              absl::StrCat(copies, "·N·", sb, " (the new version, the one streams still send",
                           c.rollout.weight_delta ? ", the delta base)" : ")"));
  }
  // learner/shm_policy.h: the latest two versions and the file prepared for
  // the next, in /dev/shm (tmpfs: host memory, though no process's RSS),
  // every weight of each (the adapters too).
  if (SyncsThroughSharedMemory(c)) {
    terms.Add("/dev/shm segments", "host", 3 * (n + adapters) * in.wire_bytes,
              "rollout.weight_transport",
              absl::StrCat(lora ? "3·(N + N_a)·" : "3·N·", in.wire_bytes,
                           " (latest two versions, the next prepared)"));
  }
  // learner/policy_publisher.cc EncodeLocked converts a whole version when
  // the wire dtype differs (with student.lora the shared frozen weights
  // once, FrozenEncoding, and the adapters per version); a delta holds up
  // to a version's bytes of XOR data, with student.lora the adapters' only
  // (ComputeDelta: a tensor both versions share is an UNCHANGED range, and
  // equal bytes are too).
  int64_t encodings = 0;
  if (in.wire_bytes != sb) {
    encodings += lora ? (n + copies * adapters) * in.wire_bytes : copies * n * in.wire_bytes;
  }
  if (KeepsDeltaBases(c)) encodings += trained * in.wire_bytes;
  if (lora) {
    terms.Add("wire encodings", "host", encodings, "rollout.weights_dtype",
              "in the wire dtype when it differs: the frozen N once + N_a per version, + N_a·wire "
              "of XOR data (adapters only, student.lora)");
  } else {
    terms.Add("wire encodings", "host", encodings,
              c.rollout.weight_delta ? "rollout.weight_delta" : "rollout.weights_dtype",
              "the versions in the wire dtype when it differs, + N·wire of XOR data with deltas");
  }
}

// Held-out evaluation (rank 0 only).
void AddEvaluation(const LearnerShape& x, const std::string& dev, Terms& terms) {
  const PlanInputs& in = x.in;
  const services::Config& c = x.c;
  const ModelDims& s = x.s;
  const int64_t v = x.v, t = x.t;
  // Held-out greedy decoding on the training thread (learner/dataset_
  // accuracy.cc, model::Sample): an fp32 KV cache of the prompts and
  // responses, and the prefill's [E, P, V] float32 logits.
  if (c.trainer.eval_examples > 0) {
    const int64_t e = std::min({c.trainer.eval_examples, in.heldout_examples, kEvalBatch});
    terms.Add("eval KV cache", dev, e * (in.prompt_tokens + t) * s.KvBytesPerToken(4),
              "trainer.eval_examples", "E·(P + T)·2·L·kv·hd·4, E = min(eval_examples, 256)");
    terms.Add("eval prefill logits", dev, e * in.prompt_tokens * v * 4, "trainer.eval_examples",
              "E·P·V·4");
  }
}

ProcessPlan PlanLearner(const PlanInputs& in, int64_t rank, int64_t world) {
  const services::Config& c = in.config;
  ProcessPlan plan;
  plan.name = world > 1 ? absl::StrCat("learner-", rank) : "learner";
  plan.device = RankDevice(c.learner.device, rank, world);
  Terms terms(plan);
  const LearnerShape shape(in, world);
  AddTrainedState(shape, world, plan.device, terms);
  AddActivations(shape, plan.device, terms);
  AddVocabularyHead(shape, plan.device, terms);
  AddBatchAndBuffer(shape, plan.device, terms);
  AddPolicySync(shape, terms);
  if (rank == 0) AddEvaluation(shape, plan.device, terms);
  terms.Add("process base", "host", kBaseLearner, "", "measured: empty kappa-learner");
  return plan;
}

ProcessPlan PlanWorker(const PlanInputs& in, int64_t index) {
  const services::Config& c = in.config;
  const ModelDims& s = in.student;
  ProcessPlan plan;
  plan.name = absl::StrCat("rollout-", index);
  plan.device = DeviceOf(c.rollout.device);
  const std::string& dev = plan.device;
  Terms terms(plan);
  const int64_t n = s.Parameters();
  const int64_t b = in.worker_weight_bytes;
  const int64_t held = c.rollout.max_outstanding;
  const int64_t g = c.trainer.group_size;
  const int64_t t = c.rollout.max_new_tokens;
  const int64_t p = in.prompt_tokens;

  // rollout_worker/policy_watcher.h: the current model and the spare the
  // next version is written into. A third exists only while a sampler
  // still decodes with the spare's old version when the next one arrives
  // (versions faster than one group); issue 38's 0.5B run never held it in
  // 20 version loads (2.22 GiB peak against 2.05 GiB planned).
  // With student.lora each copy also holds its adapters, in the copy's
  // dtype (rollout_worker/policy_watcher.cc, model::CastAdapters).
  const int64_t adapters = s.AdapterParameters(c.student.lora);
  terms.Add("policy copies", dev, 2 * (n + adapters) * b, "",
            adapters > 0 ? absl::StrCat("2·(N + N_a)·", b,
                                        " (current and spare, with the adapters: student.lora; "
                                        "a third while a sampler holds the spare)")
                         : absl::StrCat("2·N·", b,
                                        " (current and spare; a third while a sampler holds "
                                        "the spare)"));
  // model/decode_engine.h: slots × capacity columns, every layer.
  const int64_t slots = c.rollout.max_batch_rows > 0 ? c.rollout.max_batch_rows : held * g;
  const int64_t capacity = c.rollout.max_sequence_tokens > 0
                               ? c.rollout.max_sequence_tokens
                               : std::min(p + t, std::max<int64_t>(s.max_positions, 1));
  terms.Add("KV cache", dev, slots * capacity * s.KvBytesPerToken(b),
            c.rollout.max_batch_rows > 0 ? "rollout.max_batch_rows" : "rollout.max_outstanding",
            c.rollout.max_sequence_tokens > 0
                ? "slots·max_sequence_tokens·2·L·kv·hd·b"
                : "slots·min(P + T, max_position_embeddings)·2·L·kv·hd·b, slots = M·G");
  // A step's [slots, V] logits, the float32 probabilities, and a sort's
  // values and indices for top-p/top-k.
  terms.Add("sampling", dev, slots * s.vocab * (b + 4 + 12),
            c.rollout.max_batch_rows > 0 ? "rollout.max_batch_rows" : "rollout.max_outstanding",
            "slots·V·(b + 16)");
  // One prefill of at most kMaxPrefillTokens: the d- and f-wide
  // intermediates of a layer and each prompt's attention scores.
  const int64_t prefill = std::min(kMaxPrefillTokens, held * p);
  terms.Add("prefill", dev,
            prefill * (3 * s.intermediate + 6 * s.hidden) * 4 + held * s.heads * p * p * 4,
            "rollout.max_outstanding", "tokens·(3f + 6d)·4 + M·h·P²·4");
  // Each held item's ScoreResponse and the ScoredGroup built from it.
  terms.Add("scored groups in flight", "host",
            held * (ScoreResponseBytes(in) + ScoredGroupBytes(in)), "rollout.max_outstanding",
            "M·(ScoreResponse + ScoredGroup)");
  if (c.rollout.weight_transport == services::WeightTransport::kC10d) {
    terms.Add("weight group receive buffer", dev, s.LargestParameter() * in.wire_bytes, "",
              "V·d·wire (one parameter at a time)");
  }
  terms.Add("process base", "host", kBaseRolloutWorker, "", "measured: empty kappa-rollout-worker");
  return plan;
}

ProcessPlan PlanTeacher(const PlanInputs& in) {
  const services::Config& c = in.config;
  const ModelDims& m = in.teacher;
  ProcessPlan plan;
  plan.name = "teacher";
  plan.device = DeviceOf(c.teacher.device);
  const std::string& dev = plan.device;
  Terms terms(plan);
  const int64_t b = in.teacher_weight_bytes;
  const int64_t t = c.rollout.max_new_tokens;
  const int64_t positions = in.prompt_tokens + t - 1;
  // The dynamic batcher merges up to max_batch_sequences; no more can be in
  // flight than the workers hold.
  const int64_t in_flight = c.workers * c.rollout.max_outstanding * c.trainer.group_size;
  const int64_t batch = std::max<int64_t>(1, std::min(c.teacher.max_batch_sequences, in_flight));
  const int64_t rows = batch * t;

  terms.Add("weights", dev, m.Parameters() * b, "", absl::StrCat("N_t·", b));
  if (in.teacher_rows == TeacherRows::kNone) {
    terms.Add("process base", "host", kBaseTeacher, "", "measured: empty kappa-teacher");
    return plan;
  }
  // teacher_server/scorer.cc ResponseLogProbs projects the response rows
  // only: [B·T, V] in the weights' dtype, a float32 copy when that is not
  // float32, and their float32 log-softmax, alive together at its peak.
  terms.Add("response rows (running batch)", dev, rows * m.vocab * (b + (b == 4 ? 0 : 4) + 4),
            "teacher.max_batch_sequences",
            "B·T·V·(b + 4 [+ 4 when b < 4]), B = min(max_batch_sequences, workers·M·G)");
  terms.Add("forward activations", dev,
            batch * positions * (3 * m.intermediate + 6 * m.hidden) * b +
                batch * m.heads * positions * positions * 4,
            "teacher.max_batch_sequences", "B·S·(3f + 6d)·b + B·h·S²·4 (one layer)");
  // teacher_service.cc ScoreImpl: an answered caller reduces its float32
  // host rows to the requested form on its own thread while the batching
  // thread runs the next batch, so every other sequence in flight may still
  // hold its rows (measured: the tiny run's second batch peaks with the
  // first one's rows resident).
  const int64_t answered = std::max<int64_t>(0, in_flight - batch);
  terms.Add("response rows (answered, being reduced)", "host", answered * t * m.vocab * 4,
            "rollout.max_outstanding", "(workers·M·G − B)·T·V·4");
  if (dev != "host") {
    terms.Add("response rows on the host", "host", rows * m.vocab * 4,
              "teacher.max_batch_sequences", "B·T·V·4");
  }
  // The batch's answers as messages, then serialized by gRPC.
  terms.Add("responses", "host", 2 * batch * t * WireRowBytes(in), "trainer.distill_loss",
            "2·B·T·wire row (the messages and their serialized bytes)");
  terms.Add("process base", "host", kBaseTeacher, "", "measured: empty kappa-teacher");
  return plan;
}

ProcessPlan PlanVerifier() {
  ProcessPlan plan;
  plan.name = "verifier";
  plan.device = "host";
  Terms(plan).Add("process base", "host", kBaseVerifier, "", "measured: empty kappa-verifier");
  return plan;
}

// The config value of a key a term names, for the refusal's message.
std::string CurrentValue(const services::Config& c, const std::string& key) {
  if (key == "trainer.vocab_chunk_positions") return absl::StrCat(c.trainer.vocab_chunk_positions);
  if (key == "trainer.micro_batch_sequences") return absl::StrCat(c.trainer.micro_batch_sequences);
  if (key == "trainer.activation_checkpointing") {
    return c.trainer.activation_checkpointing ? "true" : "false";
  }
  if (key == "trainer.eval_examples") return absl::StrCat(c.trainer.eval_examples);
  if (key == "trainer.distill_loss")
    return std::string(services::ChoiceName(c.trainer.distill_loss));
  if (key == "trainer.distill_topk") return absl::StrCat(c.trainer.distill_topk);
  if (key == "monitor.kappa_every") return absl::StrCat(c.monitor.kappa_every);
  if (key == "learner.buffer_groups") return absl::StrCat(c.learner.buffer_groups);
  if (key == "rollout.max_outstanding") return absl::StrCat(c.rollout.max_outstanding);
  if (key == "rollout.max_batch_rows") return absl::StrCat(c.rollout.max_batch_rows);
  if (key == "rollout.weights_dtype")
    return std::string(services::ChoiceName(c.rollout.weights_dtype));
  if (key == "rollout.weight_delta") return c.rollout.weight_delta ? "true" : "false";
  if (key == "teacher.max_batch_sequences") return absl::StrCat(c.teacher.max_batch_sequences);
  if (key == "rstg.sft_weight") return absl::StrCat(c.rstg.sft_weight);
  if (key == "student.lora.rank") return absl::StrCat(c.student.lora.rank);
  if (key == "rollout.weight_transport") {
    return std::string(services::ChoiceName(c.rollout.weight_transport));
  }
  if (key == "learner.shard") return std::string(services::ChoiceName(c.learner.shard));
  if (key == "learner.world_size") return absl::StrCat(c.learner.world_size);
  return "";
}

// What to try instead, when there is an obvious direction.
std::string Suggestion(const services::Config& c, const std::string& key) {
  if (key == "trainer.vocab_chunk_positions") {
    if (c.trainer.vocab_chunk_positions == 0) return "try 1024";
    // A chunk is at most a micro-batch's response positions.
    const int64_t batch = c.trainer.groups_per_step * c.trainer.group_size /
                          std::max<int64_t>(c.learner.world_size, 1);
    const int64_t micro = c.trainer.micro_batch_sequences > 0
                              ? std::min(c.trainer.micro_batch_sequences, batch)
                              : batch;
    const int64_t rows = std::min(c.trainer.vocab_chunk_positions,
                                  std::max<int64_t>(micro * c.rollout.max_new_tokens, 2));
    return absl::StrCat("try ", rows / 2);
  }
  if (key == "trainer.activation_checkpointing") return "try true";
  if (key == "trainer.micro_batch_sequences") {
    return c.trainer.micro_batch_sequences == 0 ? "try 8" : "try fewer sequences";
  }
  if (key == "trainer.distill_loss") return "try topk_tail_reverse_kl";
  if (key == "rollout.weights_dtype") return "try bfloat16";
  if (key == "monitor.kappa_every") return "0 does not measure κ";
  if (key == "rollout.weight_delta") return "try false";
  if (key == "rollout.weight_transport") return "try grpc (no /dev/shm segments)";
  if (key == "learner.shard") {
    return c.learner.shard == services::LearnerShard::kNone ? "try optimizer or gradients"
                                                            : "try gradients";
  }
  if (key == "learner.world_size") return "try more ranks: each holds a smaller share";
  return "try a smaller value";
}

// A learner that does not fit can also split its state over more ranks.
std::string ShardingHint(const services::Config& c) {
  if (c.learner.shard == services::LearnerShard::kNone) {
    return absl::StrCat(
        "; or split the learner's state over ranks (learner.shard=none now: optimizer or "
        "gradients, with learner.world_size=",
        c.learner.world_size, " now, > 1)");
  }
  return absl::StrCat(
      "; or more ranks for smaller shares (learner.world_size=", c.learner.world_size,
      ", learner.shard=", std::string(services::ChoiceName(c.learner.shard)), " now)");
}

std::string GiB(int64_t bytes) { return absl::StrFormat("%.2f GiB", bytes / double(1 << 30)); }

}  // namespace

int64_t ModelDims::AdapterParameters(const services::Config::Student::Lora& lora) const {
  if (lora.rank <= 0) return 0;
  int64_t per_layer = 0;
  for (const std::string& name : lora.target_modules) {
    const ProjectionShape shape = ProjectionNamed(*this, name);
    per_layer += lora.rank * (shape.in + shape.out);
  }
  return layers * per_layer;
}

int64_t ModelDims::Parameters() const {
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  int64_t layer =
      hidden * q + 2 * hidden * kv + q * hidden + 3 * hidden * intermediate + 2 * hidden;
  if (qkv_bias) layer += q + 2 * kv;
  if (o_bias) layer += hidden;
  if (mlp_bias) layer += 2 * intermediate + hidden;
  if (qk_norm) layer += 2 * head_dim;
  return vocab * hidden * (tied ? 1 : 2) + layers * layer + hidden;
}

int64_t ProcessPlan::Bytes() const {
  int64_t total = 0;
  for (const PlanTerm& term : terms) total += term.bytes;
  return total;
}

int64_t ProcessPlan::Bytes(const std::string& where) const {
  int64_t total = 0;
  for (const PlanTerm& term : terms) {
    if (term.device == where) total += term.bytes;
  }
  return total;
}

std::vector<std::string> MemoryPlan::Devices() const {
  std::set<std::string> devices;
  for (const ProcessPlan& process : processes) {
    for (const PlanTerm& term : process.terms) devices.insert(term.device);
  }
  return {devices.begin(), devices.end()};
}

int64_t MemoryPlan::DeviceBytes(const std::string& device) const {
  int64_t total = 0;
  for (const ProcessPlan& process : processes) total += process.Bytes(device);
  return total;
}

int64_t ProcessBaseBytes(const std::string& binary) {
  if (binary == "kappa-learner") return kBaseLearner;
  if (binary == "kappa-rollout-worker") return kBaseRolloutWorker;
  if (binary == "kappa-teacher") return kBaseTeacher;
  if (binary == "kappa-verifier") return kBaseVerifier;
  return 0;
}

namespace {

// sync_bytes_per_version and sync_formula: each WatchPolicy stream carries
// a whole version, or with student.lora only the adapters (after the
// worker's first full version); the c10d group gets one whole broadcast.
void PlanWeightSync(const PlanInputs& in, MemoryPlan& plan) {
  const services::Config& c = in.config;
  const int64_t n = in.student.Parameters();
  const int64_t adapters = in.student.AdapterParameters(c.student.lora);
  const int64_t w = in.wire_bytes;
  const int64_t whole = (n + adapters) * w;
  const int64_t group = std::min(c.learner.weight_group_workers, c.workers);
  const bool c10d = c.rollout.weight_transport == services::WeightTransport::kC10d && group > 0;
  const int64_t streams = c10d ? c.workers - group : c.workers;
  const bool lora = TrainsAdapters(c);
  const bool adapters_only = lora && !SyncsThroughSharedMemory(c) && WorkersTakeDeltas(in);
  const int64_t per_stream = adapters_only ? adapters * w : whole;
  plan.sync_bytes_per_version = per_stream * streams + (c10d ? whole : 0);

  const std::string per_version =
      adapters_only ? absl::StrCat("N_a·", w) : absl::StrCat(lora ? "(N + N_a)·" : "N·", w);
  const std::string stream_count =
      absl::StrCat(streams, " WatchPolicy stream", streams == 1 ? "" : "s");
  std::string why;
  if (adapters_only) {
    why = absl::StrCat(" (LoRA: adapters only; the frozen N·", w, " = ", FormatBytes(n * w),
                       " once per worker)");
  } else if (lora) {
    why = SyncsThroughSharedMemory(c)
              ? " (LoRA through shared memory: every weight per version)"
              : " (LoRA, every weight per version: float32 on the wire into bfloat16 workers "
                "takes no deltas)";
  } else if (c.rollout.weight_delta) {
    why = " (at most: deltas send the changed blocks)";
  }
  plan.sync_formula = absl::StrCat(
      per_version, " = ", FormatBytes(per_stream), " × ", stream_count,
      c10d ? absl::StrCat(" + one c10d broadcast",
                          lora ? absl::StrCat(" of (N + N_a)·", w, " = ", FormatBytes(whole))
                               : std::string(),
                          " to ", group, " workers")
           : std::string(),
      why);
}

}  // namespace

MemoryPlan PlanMemory(const PlanInputs& in) {
  const services::Config& c = in.config;
  MemoryPlan plan;
  const int64_t world = std::max<int64_t>(c.learner.world_size, 1);
  for (int64_t rank = 0; rank < world; ++rank)
    plan.processes.push_back(PlanLearner(in, rank, world));
  for (int64_t w = 0; w < c.workers; ++w) plan.processes.push_back(PlanWorker(in, w));
  plan.processes.push_back(PlanTeacher(in));
  plan.processes.push_back(PlanVerifier());

  PlanWeightSync(in, plan);

  plan.messages.push_back({"ScoredGroup", ScoredGroupBytes(in), c.security.max_message_bytes,
                           "G·(T·(row + 17) + 64) + 5·P, row = teacher row bytes on the wire"});
  plan.messages.push_back(
      {"ScoreResponse", ScoreResponseBytes(in), c.security.max_message_bytes, "G·(T·row + 64)"});
  return plan;
}

absl::Status CheckPlanFits(const MemoryPlan& plan, const services::Config& config,
                           const std::map<std::string, int64_t>& capacity) {
  for (const MessagePlan& message : plan.messages) {
    if (message.bytes <= message.limit) continue;
    return absl::FailedPreconditionError(absl::StrFormat(
        "a %s message would be up to %s (%d bytes), over security.max_message_bytes=%d: with "
        "trainer.distill_loss=%s every response token carries its teacher row; raise "
        "security.max_message_bytes to at least %d, or send fewer bytes "
        "(trainer.distill_loss=topk_tail_reverse_kl, trainer.teacher_values=bf16, "
        "rollout.max_new_tokens, trainer.group_size)",
        message.name, FormatBytes(message.bytes), message.bytes, message.limit,
        std::string(services::ChoiceName(config.trainer.distill_loss)), message.bytes));
  }
  for (const std::string& device : plan.Devices()) {
    const auto it = capacity.find(device);
    if (it == capacity.end() || it->second <= 0) continue;
    const int64_t total = plan.DeviceBytes(device);
    const double allowed = kPlanFitShare * static_cast<double>(it->second);
    if (static_cast<double>(total) <= allowed) continue;
    const ProcessPlan* largest = nullptr;
    for (const ProcessPlan& process : plan.processes) {
      if (largest == nullptr || process.Bytes(device) > largest->Bytes(device)) largest = &process;
    }
    const PlanTerm* term = nullptr;
    for (const PlanTerm& candidate : largest->terms) {
      if (candidate.device != device || candidate.key.empty()) continue;
      if (term == nullptr || candidate.bytes > term->bytes) term = &candidate;
    }
    std::string change = "no term of it has a key: a smaller model or another device";
    if (term != nullptr) {
      change = absl::StrFormat("its largest term that a key changes is '%s' %s (%s=%s; %s)",
                               term->name, GiB(term->bytes), term->key,
                               CurrentValue(config, term->key), Suggestion(config, term->key));
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s needs %s of %s memory (the run %s, %.1f × %s available): %s%s", largest->name,
        GiB(largest->Bytes(device)), device, GiB(total), kPlanFitShare, GiB(it->second), change,
        absl::StartsWith(largest->name, "learner") ? ShardingHint(config) : ""));
  }
  return absl::OkStatus();
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return absl::StrFormat("%.0f KiB", b / (1 << 10));
  return absl::StrFormat("%d B", bytes);
}

}  // namespace kappa::cli
