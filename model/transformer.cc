#include "model/transformer.h"

#include <torch/torch.h>
#include <torch/version.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "model/activation_checkpoint.h"
#include "model/lora.h"
#include "model/rope.h"

// at::scaled_dot_product_attention (flash / memory-efficient kernels on CUDA)
// exists from libtorch 2.0; Debian's 1.13 uses the explicit softmax path.
#if TORCH_VERSION_MAJOR >= 2
#define KAPPA_HAVE_SDPA 1
#else
#define KAPPA_HAVE_SDPA 0
#endif

namespace kappa::model {
namespace {

namespace F = torch::nn::functional;
using torch::indexing::Slice;

// Scores of masked keys. Finite (not -inf) so a query whose keys are all
// masked (a pad row) gets a harmless uniform distribution instead of NaN;
// exp(-1e9 - max) underflows to exactly 0 next to any real key.
constexpr double kMaskedScore = -1e9;

torch::nn::Linear NoBiasLinear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

torch::nn::Linear Projection(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// Llama RMSNorm; the statistic is computed in fp32 whatever the weight dtype.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
    weight_ = register_parameter("weight", torch::ones({dim}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto x32 = x.to(torch::kFloat32);
    auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    return weight_ * normed.to(x.scalar_type());
  }

 private:
  double eps_;
  torch::Tensor weight_;
};
TORCH_MODULE(RMSNorm);

// HF "rotate_half" convention: the head dimension is split into two halves
// (not interleaved pairs). cos/sin: [B, 1, T, head_dim].
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  return x * cos + torch::cat({-x2, x1}, -1) * sin;
}

bool Targets(const LoraConfig& config, const std::string& name) {
  return std::find(config.target_modules.begin(), config.target_modules.end(), name) !=
         config.target_modules.end();
}

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& c)
      : heads_(c.num_attention_heads),
        kv_heads_(c.num_key_value_heads),
        head_dim_(c.head_dim()),
        scale_(1.0 / std::sqrt(static_cast<double>(c.head_dim()))) {
    const bool qkv_bias = c.qkv_bias();
    q_proj = register_module("q_proj", Projection(c.hidden_size, heads_ * head_dim_, qkv_bias));
    k_proj = register_module("k_proj", Projection(c.hidden_size, kv_heads_ * head_dim_, qkv_bias));
    v_proj = register_module("v_proj", Projection(c.hidden_size, kv_heads_ * head_dim_, qkv_bias));
    o_proj =
        register_module("o_proj", Projection(heads_ * head_dim_, c.hidden_size, c.o_proj_bias()));
    if (c.qk_norm()) {  // Qwen3Attention: RMSNorm over each head's head_dim
      q_norm = register_module("q_norm", RMSNorm(head_dim_, c.rms_norm_eps));
      k_norm = register_module("k_norm", RMSNorm(head_dim_, c.rms_norm_eps));
    }
  }

  // x: [B, T, D]; allowed: [B, 1, 1, T, S] bool. `write` says where this
  // layer's new keys/values go and which columns are attended (CacheWrite).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& allowed, const CacheWrite& write) {
    const int64_t B = x.size(0), T = x.size(1);
    auto q = q_lora.Apply(q_proj, x).view({B, T, heads_, head_dim_});
    auto k = k_lora.Apply(k_proj, x).view({B, T, kv_heads_, head_dim_});
    if (q_norm) {  // before RoPE, per head
      q = q_norm(q);
      k = k_norm(k);
    }
    q = q.transpose(1, 2);
    k = k.transpose(1, 2);
    auto v = v_lora.Apply(v_proj, x).view({B, T, kv_heads_, head_dim_}).transpose(1, 2);
    q = ApplyRope(q, cos, sin);
    k = ApplyRope(k, cos, sin);
    if (write.columns.defined()) {
      // One token per row: row r's key/value go to column columns[r] of slot
      // r, and the first `width` columns of each slot are attended.
      auto cache_k = write.keys->narrow(0, 0, B);
      auto cache_v = write.values->narrow(0, 0, B);
      auto index = write.columns.view({B, 1, 1, 1}).expand({B, kv_heads_, 1, head_dim_});
      cache_k.scatter_(2, index, k);
      cache_v.scatter_(2, index, v);
      auto out = SlotAttention(q, cache_k, cache_v, allowed, write.width);
      return o_lora.Apply(o_proj, out.transpose(1, 2).reshape({B, T, heads_ * head_dim_}));
    }
    if (write.keys != nullptr) {
      write.keys->narrow(2, write.start, T).copy_(k);
      write.values->narrow(2, write.start, T).copy_(v);
      k = write.keys->narrow(2, 0, write.start + T);
      v = write.values->narrow(2, 0, write.start + T);
    }
    auto out = UseSdpa() ? SdpaAttention(q, k, v, allowed) : ExplicitAttention(q, k, v, allowed);
    return o_lora.Apply(o_proj, out.transpose(1, 2).reshape({B, T, heads_ * head_dim_}));
  }

  // Attaches an adapter to each of q/k/v/o_proj that `config` targets.
  void EnableLora(const LoraConfig& config) {
    for (auto [name, projection, branch] :
         {std::tuple{"q_proj", &q_proj, &q_lora}, std::tuple{"k_proj", &k_proj, &k_lora},
          std::tuple{"v_proj", &v_proj, &v_lora}, std::tuple{"o_proj", &o_proj, &o_lora}}) {
      if (Targets(config, name)) branch->Attach(**projection, config);
    }
  }

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  LoraBranch q_lora, k_lora, v_lora, o_lora;
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3 only

 private:
  // q: [B, H, T, hd]; k, v: [B, kv, S, hd]; allowed [B|1, 1, 1, T, S].
  // Returns [B, H, T, hd].
  torch::Tensor ExplicitAttention(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const torch::Tensor& allowed) {
    const int64_t B = q.size(0), T = q.size(2), S = k.size(2);
    const int64_t group = heads_ / kv_heads_;
    // Grouped KV without materializing repeated keys: query head h uses KV
    // head h / group (HF repeat_kv order), so fold the group into the query
    // length and let one matmul per KV head do the work.
    auto qg = q.reshape({B, kv_heads_, group * T, head_dim_});
    auto scores = torch::matmul(qg, k.transpose(-2, -1)).mul_(scale_);
    scores = scores.view({B, kv_heads_, group, T, S})
                 .to(torch::kFloat32)
                 .masked_fill(allowed.logical_not(), kMaskedScore);
    auto probs = torch::softmax(scores, -1).to(v.scalar_type()).view({B, kv_heads_, group * T, S});
    // [B, kv, group*T, hd] is [B, H, T, hd] in HF's head order.
    return torch::matmul(probs, v).view({B, heads_, T, head_dim_});
  }

  // The explicit path for one query per slot over the first `width` columns
  // of slot buffers [B, kv, capacity, hd]: each (slot, KV head) is one batch
  // of a strided bmm (no copy of the keys, no per-row loop), softmax in fp32.
  // q: [B, H, 1, hd]; allowed [B, 1, 1, 1, width]. Returns [B, H, 1, hd].
  torch::Tensor SlotAttention(const torch::Tensor& q, const torch::Tensor& cache_k,
                              const torch::Tensor& cache_v, const torch::Tensor& allowed,
                              int64_t width) {
    const int64_t B = q.size(0), capacity = cache_k.size(2);
    const int64_t group = heads_ / kv_heads_;
    auto k = cache_k.view({B * kv_heads_, capacity, head_dim_}).narrow(1, 0, width);
    auto v = cache_v.view({B * kv_heads_, capacity, head_dim_}).narrow(1, 0, width);
    auto qg = q.reshape({B * kv_heads_, group, head_dim_});  // HF repeat_kv order
    auto scores = torch::bmm(qg, k.transpose(1, 2)).mul_(scale_);
    scores = scores.view({B, kv_heads_, group, 1, width})
                 .to(torch::kFloat32)
                 .masked_fill(allowed.logical_not(), kMaskedScore);
    auto probs = torch::softmax(scores, -1).to(v.scalar_type()).view({B * kv_heads_, group, width});
    return torch::bmm(probs, v).view({B, heads_, 1, head_dim_});
  }

  static bool UseSdpa() { return KAPPA_HAVE_SDPA && AttentionBackend() == AttentionKind::kSdpa; }

  // The fused kernel; GQA by repeating each KV head `group` times (HF
  // repeat_kv order). The mask is additive with the same finite masked score
  // as the explicit path, so a pad query with no visible key stays finite.
  torch::Tensor SdpaAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& allowed) {
#if KAPPA_HAVE_SDPA
    const int64_t group = heads_ / kv_heads_;
    auto kr = group == 1 ? k : k.repeat_interleave(group, 1);
    auto vr = group == 1 ? v : v.repeat_interleave(group, 1);
    auto mask = allowed.squeeze(1).to(q.scalar_type());  // [B|1, 1, T, S]
    mask = (1 - mask) * kMaskedScore;
    return at::scaled_dot_product_attention(q, kr, vr, mask);
#else
    (void)k, (void)v, (void)allowed;
    return q;  // unreachable: UseSdpa() is false without the kernel
#endif
  }

  int64_t heads_, kv_heads_, head_dim_;
  double scale_;
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelConfig& c) {
    gate_proj =
        register_module("gate_proj", Projection(c.hidden_size, c.intermediate_size, c.mlp_bias));
    up_proj =
        register_module("up_proj", Projection(c.hidden_size, c.intermediate_size, c.mlp_bias));
    down_proj =
        register_module("down_proj", Projection(c.intermediate_size, c.hidden_size, c.mlp_bias));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return down_lora.Apply(down_proj,
                           F::silu(gate_lora.Apply(gate_proj, x)) * up_lora.Apply(up_proj, x));
  }
  // Attaches an adapter to each of gate/up/down_proj that `config` targets.
  void EnableLora(const LoraConfig& config) {
    for (auto [name, projection, branch] : {std::tuple{"gate_proj", &gate_proj, &gate_lora},
                                            std::tuple{"up_proj", &up_proj, &up_lora},
                                            std::tuple{"down_proj", &down_proj, &down_lora}}) {
      if (Targets(config, name)) branch->Attach(**projection, config);
    }
  }
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  LoraBranch gate_lora, up_lora, down_lora;
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const ModelConfig& c) {
    input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
    self_attn = register_module("self_attn", Attention(c));
    post_attention_layernorm =
        register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
    mlp = register_module("mlp", Mlp(c));
  }
  // h: [B, T, D] -> [B, T, D]; `write` as AttentionImpl's.
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& allowed, const CacheWrite& write) {
    auto x = h + self_attn->forward(input_layernorm(h), cos, sin, allowed, write);
    return x + mlp(post_attention_layernorm(x));
  }
  RMSNorm input_layernorm{nullptr};
  Attention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

[[noreturn]] void Fail(const std::string& what) { throw std::invalid_argument("Decoder: " + what); }

std::string Shape(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

std::atomic<AttentionKind> attention_backend{KAPPA_HAVE_SDPA ? AttentionKind::kSdpa
                                                             : AttentionKind::kExplicit};

}  // namespace

bool SdpaAvailable() { return KAPPA_HAVE_SDPA; }
AttentionKind AttentionBackend() { return attention_backend.load(std::memory_order_relaxed); }
void SetAttentionBackend(AttentionKind kind) {
  if (kind == AttentionKind::kSdpa && !KAPPA_HAVE_SDPA) {
    throw std::invalid_argument(
        "Decoder: scaled_dot_product_attention needs libtorch >= 2.0, this is " +
        std::string(TORCH_VERSION));
  }
  attention_backend.store(kind, std::memory_order_relaxed);
}

// Called on each piece of a Decoder (the embedding, a block, the final norm,
// an untied lm_head) the moment it is built, in registration order.
using FinishPiece = std::function<void(torch::nn::Module& piece)>;

class LlamaModelImpl : public torch::nn::Module {
 public:
  LlamaModelImpl(const ModelConfig& c, const FinishPiece& finish) {
    embed_tokens =
        register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
    finish(*embed_tokens);
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      DecoderLayer layer(c);
      finish(*layer);
      layers->push_back(layer);
      blocks.push_back(layer);
    }
    norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
    finish(*norm);
  }
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<DecoderLayer> blocks;  // typed view of `layers`
  RMSNorm norm{nullptr};
};

namespace {

// HF LlamaPreTrainedModel._init_weights: N(0, 0.02) for linear and
// embedding weights, zero biases; RMSNorm weights stay 1.
void InitLikeHf(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    const std::string& name = p.key();
    if (name.find("norm.weight") != std::string::npos) continue;  // *layernorm, norm, q/k_norm
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.value().zero_();
    } else {
      p.value().normal_(0.0, 0.02);
    }
  }
}

// The float32 pieces freed while a model was placed stay in glibc's heap
// (block-sized tensors fall under its dynamic mmap threshold) and would
// count as resident until reused: ~490 MiB after a Qwen2.5-0.5B-shaped
// bfloat16 build. malloc_trim hands the free pages back, after each piece
// (a few milliseconds each), so the holes never add up.
void ReleaseFreedHostMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace

DecoderImpl::DecoderImpl(const ModelConfig& config, bool random_init, const Placement& placement)
    : config_(config) {
  config_.Validate();
  // Without random_init each piece goes to `placement` as it is built. With
  // it, the values are drawn over the whole float32 model first (the same
  // numbers, in the same order, whatever the placement) and the model moves
  // once, at the end.
  const FinishPiece finish = [&](torch::nn::Module& piece) {
    if (random_init) return;
    piece.to(placement.device, placement.dtype);
    ReleaseFreedHostMemory();
  };
  model_ = register_module("model", std::make_shared<LlamaModelImpl>(config_, finish));
  if (config_.tie_word_embeddings) {
    // A 1x1 holder whose `weight` member is then pointed at the embedding: a
    // full [V, D] Linear would keep its own registered weight alive (519 MB
    // at Qwen2.5-0.5B's vocabulary) although nothing reads it.
    lm_head_ = NoBiasLinear(1, 1);
    lm_head_->weight = model_->embed_tokens->weight;
  } else {
    lm_head_ = register_module("lm_head", NoBiasLinear(config_.hidden_size, config_.vocab_size));
    finish(*lm_head_);
  }
  auto [cos, sin] = RopeTables(config_);
  rope_cos_ = register_buffer("rope_cos", cos);
  rope_sin_ = register_buffer("rope_sin", sin);
  if (random_init) InitLikeHf(*this);
  // Everything not placed yet: the whole model after random_init, else only
  // the RoPE tables (pieces already placed are left as they are, no copy).
  to(placement.device, placement.dtype);
}

KVCache DecoderImpl::NewCache(int64_t batch, int64_t capacity) const {
  if (batch <= 0 || capacity <= 0) Fail("NewCache needs batch > 0 and capacity > 0");
  const auto& w = model_->embed_tokens->weight;
  auto opts = w.options().requires_grad(false);
  KVCache cache;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.keys.push_back(
        torch::zeros({batch, config_.num_key_value_heads, capacity, config_.head_dim()}, opts));
    cache.values.push_back(
        torch::zeros({batch, config_.num_key_value_heads, capacity, config_.head_dim()}, opts));
  }
  cache.key_valid = torch::zeros({batch, capacity}, opts.dtype(torch::kBool));
  cache.length = 0;
  return cache;
}

ForwardOutput DecoderImpl::Forward(const torch::Tensor& tokens, const torch::Tensor& attention_mask,
                                   const torch::Tensor& positions, KVCache* cache) {
  return Run(tokens, attention_mask, positions, cache, /*logits=*/true);
}

ForwardOutput DecoderImpl::ForwardHidden(const torch::Tensor& tokens,
                                         const torch::Tensor& attention_mask,
                                         const torch::Tensor& positions, KVCache* cache) {
  return Run(tokens, attention_mask, positions, cache, /*logits=*/false);
}

SlotKVCache DecoderImpl::NewSlotCache(int64_t slots, int64_t capacity) const {
  if (slots <= 0 || capacity <= 0) Fail("NewSlotCache needs slots > 0 and capacity > 0");
  const auto& w = model_->embed_tokens->weight;
  auto opts = w.options().requires_grad(false);
  SlotKVCache cache;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.keys.push_back(
        torch::zeros({slots, config_.num_key_value_heads, capacity, config_.head_dim()}, opts));
    cache.values.push_back(
        torch::zeros({slots, config_.num_key_value_heads, capacity, config_.head_dim()}, opts));
  }
  return cache;
}

torch::Tensor DecoderImpl::DecodeSlots(const std::vector<int64_t>& tokens,
                                       const std::vector<int64_t>& lengths, SlotKVCache* cache) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0 || lengths.size() != tokens.size()) {
    Fail("DecodeSlots needs one length per token and at least one token, got " +
         std::to_string(tokens.size()) + " tokens and " + std::to_string(lengths.size()) +
         " lengths");
  }
  if (cache == nullptr || static_cast<int64_t>(cache->keys.size()) != config_.num_hidden_layers ||
      n > cache->slots()) {
    Fail("slot cache does not match this model or has fewer than " + std::to_string(n) +
         " slots (use NewSlotCache)");
  }
  int64_t width = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t length = lengths[static_cast<size_t>(i)];
    const int64_t token = tokens[static_cast<size_t>(i)];
    if (length < 0 || length >= cache->capacity() || length >= config_.max_position_embeddings) {
      Fail("slot " + std::to_string(i) + " length " + std::to_string(length) +
           " leaves no column in a slot of " + std::to_string(cache->capacity()) +
           " (max_position_embeddings " + std::to_string(config_.max_position_embeddings) + ")");
    }
    if (token < 0 || token >= config_.vocab_size) {
      Fail("slot " + std::to_string(i) + " token " + std::to_string(token) +
           " outside the vocabulary");
    }
    width = std::max(width, length + 1);
  }
  const auto device = model_->embed_tokens->weight.device();
  auto long_opts = torch::TensorOptions().dtype(torch::kLong);
  auto token_t = torch::tensor(tokens, long_opts).to(device).view({n, 1});
  auto columns = torch::tensor(lengths, long_opts).to(device);

  // A row's new token sits at column lengths[r] (also its RoPE position:
  // slots hold their sequence from column 0) and sees columns <= that one.
  auto cos = rope_cos_.index_select(0, columns).view({n, 1, 1, -1});
  auto sin = rope_sin_.index_select(0, columns).view({n, 1, 1, -1});
  const auto dtype = model_->embed_tokens->weight.scalar_type();
  cos = cos.to(dtype);
  sin = sin.to(dtype);
  auto allowed =
      torch::arange(width, long_opts.device(device)).unsqueeze(0) <= columns.unsqueeze(1);
  allowed = allowed.view({n, 1, 1, 1, width});

  auto h = model_->embed_tokens(token_t);
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    CacheWrite write;
    write.keys = &cache->keys[static_cast<size_t>(i)];
    write.values = &cache->values[static_cast<size_t>(i)];
    write.columns = columns;
    write.width = width;
    h = model_->blocks[static_cast<size_t>(i)]->forward(h, cos, sin, allowed, write);
  }
  h = model_->norm(h);
  return F::linear(h.select(1, 0), OutputWeight());
}

void DecoderImpl::EnableLora(const LoraConfig& config) {
  config.Validate();
  if (has_lora()) Fail("EnableLora: the model has LoRA adapters already");
  for (DecoderLayer& block : model_->blocks) {
    block->self_attn->EnableLora(config);
    block->mlp->EnableLora(config);
  }
  lora_ = config;
}

torch::Tensor DecoderImpl::OutputWeight() const {
  return config_.tie_word_embeddings ? model_->embed_tokens->weight : lm_head_->weight;
}

ForwardOutput DecoderImpl::Run(const torch::Tensor& tokens_in, const torch::Tensor& attention_mask,
                               const torch::Tensor& positions_in, KVCache* cache, bool logits) {
  if (tokens_in.dim() != 2) Fail("tokens must be [B, T], got " + Shape(tokens_in));
  const auto device = model_->embed_tokens->weight.device();
  auto tokens = tokens_in.to(device, torch::kLong);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  if (T == 0) Fail("tokens must have at least one position");

  torch::Tensor mask;  // [B, T] bool, undefined = all real
  if (attention_mask.defined()) {
    if (attention_mask.sizes() != tokens.sizes()) {
      Fail("attention_mask shape " + Shape(attention_mask) + " != tokens shape " + Shape(tokens));
    }
    mask = attention_mask.to(device).to(torch::kBool);
  }

  const int64_t start = cache ? cache->length : 0;
  const int64_t S = start + T;
  torch::Tensor key_valid;  // [B, S]
  if (cache) {
    if (static_cast<int64_t>(cache->keys.size()) != config_.num_hidden_layers ||
        !cache->key_valid.defined() || cache->key_valid.size(0) != B) {
      Fail("KV cache does not match this model and batch (use NewCache(" + std::to_string(B) +
           ", capacity))");
    }
    if (S > cache->key_valid.size(1)) {
      Fail("KV cache is full: " + std::to_string(start) + " + " + std::to_string(T) +
           " tokens exceed capacity " + std::to_string(cache->key_valid.size(1)));
    }
    auto slot = cache->key_valid.narrow(1, start, T);
    if (mask.defined()) {
      slot.copy_(mask);
    } else {
      slot.fill_(true);
    }
    key_valid = cache->key_valid.narrow(1, 0, S);
  } else {
    key_valid = mask;
  }

  torch::Tensor positions;
  if (positions_in.defined()) {
    if (positions_in.sizes() != tokens.sizes()) {
      Fail("positions shape " + Shape(positions_in) + " != tokens shape " + Shape(tokens));
    }
    positions = positions_in.to(device, torch::kLong);
  } else if (!mask.defined() && (!cache || start == 0)) {
    positions = torch::arange(T, tokens.options()).expand({B, T});
  } else {
    // Real tokens before each token, so left padding does not shift RoPE.
    auto real = mask.defined() ? mask.to(torch::kLong) : torch::ones_like(tokens);
    positions = real.cumsum(1) - 1;
    if (cache && start > 0) {
      positions = positions + cache->key_valid.narrow(1, 0, start).sum(1, true);
    }
    positions = positions.clamp_min(0);
  }
  {
    // One device sync for both bounds; an out-of-range index would otherwise
    // be a device-side assert on CUDA.
    auto bounds = torch::stack({positions.min(), positions.max()}).cpu();
    const int64_t min_pos = bounds[0].item<int64_t>();
    const int64_t max_pos = bounds[1].item<int64_t>();
    if (min_pos < 0 || max_pos >= config_.max_position_embeddings) {
      Fail("positions must lie in [0, " + std::to_string(config_.max_position_embeddings) +
           "), got [" + std::to_string(min_pos) + ", " + std::to_string(max_pos) + "]");
    }
  }
  auto flat = positions.reshape({-1});
  auto cos = rope_cos_.index_select(0, flat).view({B, 1, T, -1});
  auto sin = rope_sin_.index_select(0, flat).view({B, 1, T, -1});
  const auto dtype = model_->embed_tokens->weight.scalar_type();
  cos = cos.to(dtype);
  sin = sin.to(dtype);

  // Query i sits at cache slot start + i and may see slots <= that one.
  auto q_slot = torch::arange(start, S, tokens.options()).unsqueeze(1);
  auto k_slot = torch::arange(S, tokens.options()).unsqueeze(0);
  auto allowed = (k_slot <= q_slot).unsqueeze(0);  // [1, T, S]
  if (key_valid.defined()) allowed = allowed.logical_and(key_valid.unsqueeze(1));
  allowed = allowed.view({allowed.size(0), 1, 1, T, S});

  // Generation (a cache) runs under no-grad, and a cache is written in place
  // by the forward, so it is never checkpointed.
  const bool checkpoint =
      activation_checkpointing_ && torch::GradMode::is_enabled() && cache == nullptr;
  auto h = sparse_embedding_gradient_ && torch::GradMode::is_enabled()
               ? torch::embedding(model_->embed_tokens->weight, tokens, /*padding_idx=*/-1,
                                  /*scale_grad_by_freq=*/false, /*sparse=*/true)
               : model_->embed_tokens(tokens);
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    DecoderLayer& layer = model_->blocks[static_cast<size_t>(i)];
    if (checkpoint) {
      // cos, sin, allowed do not require grad (buffers, a bool mask), so the
      // layer is differentiable only in h and its parameters.
      h = Checkpoint(
          [impl = layer.ptr(), cos, sin, allowed](const torch::Tensor& x) {
            return impl->forward(x, cos, sin, allowed, CacheWrite{});
          },
          h, layer->parameters());
    } else {
      CacheWrite write;
      if (cache) {
        write.keys = &cache->keys[static_cast<size_t>(i)];
        write.values = &cache->values[static_cast<size_t>(i)];
        write.start = start;
      }
      h = layer->forward(h, cos, sin, allowed, write);
    }
  }
  h = model_->norm(h);
  if (cache) cache->length = S;

  ForwardOutput out;
  out.hidden = h;
  if (logits) out.logits = F::linear(h, OutputWeight());
  return out;
}

Decoder CloneDecoder(Decoder& source) {
  Decoder copy(source->config());
  // By value: named_parameters() returns a temporary dict, and a reference
  // into it dangles (it crashed under g++ 13 with libtorch 2.11).
  const torch::Tensor w = source->named_parameters().front().value();
  copy->to(w.device(), w.scalar_type());
  if (source->has_lora()) copy->EnableLora(source->lora_config());  // float32, as the source's
  torch::NoGradGuard no_grad;
  auto src_params = source->named_parameters();
  auto dst_params = copy->named_parameters();
  for (auto& p : src_params) dst_params[p.key()].copy_(p.value());
  auto src_buffers = source->named_buffers();
  auto dst_buffers = copy->named_buffers();
  for (auto& b : src_buffers) dst_buffers[b.key()].copy_(b.value());
  copy->train(source->is_training());
  copy->SetActivationCheckpointing(source->activation_checkpointing());
  copy->SetSparseEmbeddingGradient(source->sparse_embedding_gradient());
  return copy;
}

}  // namespace kappa::model
