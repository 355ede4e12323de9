// Low-rank adapters on a decoder's projections, the way Hugging Face PEFT's
// LoRA computes them (peft/tuners/lora/layer.py): a targeted projection
// y = W x + b becomes
//   y = W x + b + scaling · B (A (dropout(x))),
//   scaling = alpha / r   (alpha / √r with use_rslora),
// A: [r, in] with nn.Linear's default (kaiming-uniform) initialization, B:
// [out, r] zeros, so a model with fresh adapters computes what it did
// without them. The adapters are registered under their projection as
// `lora_A` and `lora_B` (parameter names
// "model.layers.N.self_attn.q_proj.lora_A.weight", PEFT's names without its
// "base_model.model." prefix and adapter name).
#pragma once

#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kappa::model {

struct LoraConfig {
  int64_t rank = 8;      // r >= 1
  double alpha = 16.0;   // > 0
  double dropout = 0.0;  // in [0, 1): on the adapter's input only, in training
  bool use_rslora = false;
  // Hugging Face module names, each one of q_proj k_proj v_proj o_proj
  // gate_proj up_proj down_proj, none twice.
  std::vector<std::string> target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};

  double Scaling() const;
  // Throws std::invalid_argument naming the field (lora.rank, lora.alpha,
  // lora.dropout, lora.target_modules) that is out of range or unknown.
  void Validate() const;
};

// The projections an adapter may target, in the order of a decoder layer.
const std::vector<std::string>& LoraTargetNames();

// One projection's adapter: empty (no adapter) until Attach.
class LoraBranch {
 public:
  // Registers `lora_A` ([rank, in]) and `lora_B` ([out, rank], zeros) under
  // `projection`, on its device and in float32. REQUIRES: no adapter yet.
  void Attach(torch::nn::LinearImpl& projection, const LoraConfig& config);
  bool attached() const { return !a_.is_empty(); }
  // projection(x) plus, with an adapter, scaling · B(A(dropout(x))) in the
  // adapter's dtype, added in the projection's.
  torch::Tensor Apply(torch::nn::Linear& projection, const torch::Tensor& x) const;

 private:
  torch::nn::Linear a_{nullptr}, b_{nullptr};
  double scaling_ = 0.0;
  double dropout_ = 0.0;
};

}  // namespace kappa::model
