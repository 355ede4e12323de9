// Decoder-only transformer of Hugging Face's Llama, Qwen2 and Qwen3: token
// embedding, pre-norm blocks of RMSNorm -> causal multi-head attention with
// RoPE (grouped KV heads optional; Qwen2's q/k/v biases, Qwen3's per-head
// q_norm/k_norm before RoPE) -> RMSNorm -> SwiGLU MLP, final RMSNorm, output
// projection (tied to the embedding or not). Parameter names are HF's
// ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight", ...) so
// checkpoints interchange; ModelConfig says which parameters exist.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <vector>

#include "model/lora.h"
#include "model/model_config.h"

namespace kappa::model {

class LlamaModelImpl;  // embedding, blocks and final norm ("model.*" names)

// How attention is computed. kSdpa is at::scaled_dot_product_attention
// (flash / memory-efficient kernels on CUDA), available with libtorch >= 2.0
// and the default there; kExplicit (matmul, fp32 softmax, matmul) is the
// only one on Debian's libtorch 1.13. Both give the same logits. Process-wide;
// SetAttentionBackend(kSdpa) throws std::invalid_argument where it is absent.
enum class AttentionKind { kExplicit, kSdpa };
bool SdpaAvailable();
AttentionKind AttentionBackend();
void SetAttentionBackend(AttentionKind kind);

// Per-layer key/value cache for incremental decoding. Keys/values are stored
// as [B, n_kv_heads, capacity, head_dim]; `length` positions are filled.
struct KVCache {
  std::vector<torch::Tensor> keys;
  std::vector<torch::Tensor> values;
  int64_t length = 0;
  // Key padding mask [B, capacity] (true = a real token may be attended).
  torch::Tensor key_valid;
};

// Per-slot key/value buffers for continuous batching (model/decode_engine.h):
// keys/values [slots, n_kv_heads, capacity, head_dim] per layer; slot s holds
// one sequence from column 0, so a token's column is its position. Which
// columns are filled is the caller's bookkeeping (DecodeSlots' `lengths`).
struct SlotKVCache {
  std::vector<torch::Tensor> keys;
  std::vector<torch::Tensor> values;
  int64_t slots() const { return keys.empty() ? 0 : keys.front().size(0); }
  int64_t capacity() const { return keys.empty() ? 0 : keys.front().size(2); }
  int64_t bytes() const {
    int64_t total = 0;
    for (const auto& k : keys) total += static_cast<int64_t>(k.nbytes());
    return 2 * total;
  }
};

// Where one layer's new keys/values go (no cache: nowhere): columns
// [start, start + T) of every row of a KVCache, attending columns
// [0, start + T); or, when `columns` [B] is defined (DecodeSlots, T = 1),
// column columns[r] of slot r, attending columns [0, width).
struct CacheWrite {
  torch::Tensor* keys = nullptr;
  torch::Tensor* values = nullptr;
  int64_t start = 0;
  torch::Tensor columns;
  int64_t width = 0;
};

struct ForwardOutput {
  torch::Tensor logits;  // [B, T, V]; undefined from ForwardHidden
  torch::Tensor hidden;  // [B, T, D] final hidden state (after the last norm)
};

// Where a Decoder's parameters and buffers are made, and in what dtype.
struct Placement {
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat32;
};

class DecoderImpl : public torch::nn::Module {
 public:
  // Parameters and buffers on `placement` (default: float32 on the CPU).
  // With random_init, initialized as HF does (N(0, 0.02), zero biases, unit
  // norms); without, left as the modules construct them, for a caller that
  // overwrites every one (LoadCheckpoint, a rollout worker's policy copy).
  // libtorch's modules make their parameters in float32 on the CPU. Without
  // random_init each piece (the embedding, one block, the final norm, an
  // untied lm_head) moves to `placement` as soon as it is built, so at most
  // one piece exists in float32 on the host at a time: a bfloat16 or CUDA
  // model needs its own size plus its largest piece, not its float32 size.
  // With random_init the values are drawn over the whole float32 model (the
  // same numbers whatever the placement) and the model moves at the end.
  explicit DecoderImpl(const ModelConfig& config, bool random_init = true,
                       const Placement& placement = {});

  // tokens: [B, T] int64. attention_mask: optional [B, T] bool/int (1 = real
  // token, 0 = padding); padding keys are never attended. positions: optional
  // [B, T] int64 RoPE positions (default: the number of real tokens before
  // each token, counting the cache: 0..T-1 without padding, cache->length..
  // with a cache of unpadded rows, and correct per-row positions for
  // left-padded batches). With `cache`, keys/values are written at
  // cache->length.. and the queries attend to every valid cached key;
  // cache->length advances by T. Throws std::invalid_argument on bad shapes,
  // positions >= max_position_embeddings or a full cache.
  ForwardOutput Forward(const torch::Tensor& tokens, const torch::Tensor& attention_mask = {},
                        const torch::Tensor& positions = {}, KVCache* cache = nullptr);

  // Forward without the output projection: `hidden` as Forward gives it
  // (same graph, same checkpointing, the same cache writes), `logits`
  // undefined, for a caller that projects only the positions it needs
  // (chunks in the learner, a prompt's last position in the decode engine)
  // with OutputWeight(). Throws as Forward does.
  ForwardOutput ForwardHidden(const torch::Tensor& tokens, const torch::Tensor& attention_mask = {},
                              const torch::Tensor& positions = {}, KVCache* cache = nullptr);

  // Zeroed per-slot buffers in the parameters' dtype and device (SlotKVCache).
  SlotKVCache NewSlotCache(int64_t slots, int64_t capacity) const;
  // One decode step of continuous batching over slots [0, n), n =
  // tokens.size(): slot r's `lengths[r]` tokens are cached in columns
  // [0, lengths[r]); tokens[r] is written at column lengths[r] (its RoPE
  // position) and attends the columns up to it. Returns the next-token
  // logits [n, V]. A free slot may ride along with any token and length 0
  // (it only writes column 0, which its next occupant's prefill overwrites).
  // REQUIRES: no-grad (the cache is written in place). Throws
  // std::invalid_argument when n exceeds the cache's slots, a length leaves
  // no column (capacity, max_position_embeddings) or a token is outside the
  // vocabulary.
  torch::Tensor DecodeSlots(const std::vector<int64_t>& tokens, const std::vector<int64_t>& lengths,
                            SlotKVCache* cache);

  // The output projection's weight [vocab_size, hidden_size]: the parameter
  // itself (with its graph, so gradients of hidden @ OutputWeight().t()
  // reach it), lm_head.weight, or model.embed_tokens.weight when the
  // embeddings are tied. No bias: Forward's logits are exactly
  // F::linear(hidden, OutputWeight()).
  torch::Tensor OutputWeight() const;

  // Activation checkpointing (off by default). When on, a Forward with grad
  // mode enabled and no KV cache keeps only each decoder layer's input
  // [B, T, D] for backward instead of the layer's activations (attention
  // scores and probabilities, MLP intermediates, ...); each backward pass
  // recomputes each layer once (model/activation_checkpoint.h), so a graph
  // traversed k times (retain_graph, per-position autograd::grad) runs each
  // layer's forward k extra times. Gradients equal the unchecked ones (the
  // layers are deterministic); double backward (create_graph=true) throws
  // std::invalid_argument. The embedding, the final norm and the output
  // projection are not checkpointed. Not synchronized: set it while no
  // Forward runs. CloneDecoder copies it.
  void SetActivationCheckpointing(bool on) { activation_checkpointing_ = on; }

  // The token lookup's gradient as a sparse tensor (the T looked-up rows)
  // instead of a dense [V, d] one of zeros but T rows: backward adds it in
  // place into embed_tokens' .grad, or, with tied embeddings, into the
  // output head's dense [V, d] gradient, so no second and third [V, d]
  // tensor exists (519 MiB each at Qwen2.5-0.5B's shape; libtorch adds two
  // dense gradients of one leaf out of place). REQUIRES: every backward
  // through Forward runs with embed_tokens' .grad already defined and dense
  // (learner::PolicyOptimizer attaches its flat buffers' views before each
  // one); otherwise .grad becomes the sparse tensor, which AdamW refuses.
  // torch::autograd::grad returns it sparse for an untied model. Values are
  // the dense lookup's. Not synchronized: set it while no Forward runs.
  // CloneDecoder copies it.
  void SetSparseEmbeddingGradient(bool on) { sparse_embedding_gradient_ = on; }

  // Low-rank adapters (model/lora.h) on the projections `config` targets, in
  // every layer, on the model's device in float32; the base weights are
  // left as they are (freezing them is the trainer's choice). Throws
  // std::invalid_argument as LoraConfig::Validate does, or when the model
  // has adapters already.
  void EnableLora(const LoraConfig& config);
  bool has_lora() const { return lora_.has_value(); }
  // The adapters' config. REQUIRES: has_lora().
  const LoraConfig& lora_config() const { return *lora_; }
  bool activation_checkpointing() const { return activation_checkpointing_; }
  bool sparse_embedding_gradient() const { return sparse_embedding_gradient_; }

  // Convenience: logits only.
  torch::Tensor forward(const torch::Tensor& tokens) { return Forward(tokens).logits; }

  KVCache NewCache(int64_t batch, int64_t capacity) const;
  const ModelConfig& config() const { return config_; }
  torch::nn::Linear& lm_head() { return lm_head_; }

 private:
  ForwardOutput Run(const torch::Tensor& tokens, const torch::Tensor& attention_mask,
                    const torch::Tensor& positions, KVCache* cache, bool logits);

  ModelConfig config_;
  std::shared_ptr<LlamaModelImpl> model_;
  // Tied: shares model.embed_tokens.weight and is not registered, so the
  // parameter appears (and is optimized) once.
  torch::nn::Linear lm_head_{nullptr};
  // RoPE tables [max_position_embeddings, head_dim], registered buffers so
  // they follow .to(device).
  torch::Tensor rope_cos_;
  torch::Tensor rope_sin_;
  bool activation_checkpointing_ = false;
  bool sparse_embedding_gradient_ = false;
  std::optional<LoraConfig> lora_;  // set by EnableLora
};
TORCH_MODULE(Decoder);

// Deep copy with identical weights (used for snapshots and weight publication).
Decoder CloneDecoder(Decoder& source);

}  // namespace kappa::model
