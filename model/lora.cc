#include "model/lora.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

namespace kappa::model {

const std::vector<std::string>& LoraTargetNames() {
  static const std::vector<std::string> kNames = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"};
  return kNames;
}

double LoraConfig::Scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / rank;
}

void LoraConfig::Validate() const {
  if (rank < 1) throw std::invalid_argument("lora.rank must be >= 1, got " + std::to_string(rank));
  if (!(alpha > 0)) throw std::invalid_argument("lora.alpha must be > 0");
  if (!(dropout >= 0 && dropout < 1)) throw std::invalid_argument("lora.dropout must be in [0, 1)");
  if (target_modules.empty()) throw std::invalid_argument("lora.target_modules is empty");
  std::set<std::string> seen;
  for (const std::string& name : target_modules) {
    const auto& known = LoraTargetNames();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw std::invalid_argument("lora.target_modules: '" + name +
                                  "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                  "up_proj, down_proj");
    }
    if (!seen.insert(name).second) {
      throw std::invalid_argument("lora.target_modules: '" + name + "' listed twice");
    }
  }
}

void LoraBranch::Attach(torch::nn::LinearImpl& projection, const LoraConfig& config) {
  if (attached()) throw std::logic_error("LoraBranch::Attach: the projection has an adapter");
  const int64_t in = projection.weight.size(1), out = projection.weight.size(0);
  const auto on = torch::TensorOptions().device(projection.weight.device()).dtype(torch::kFloat32);
  torch::nn::Linear a(torch::nn::LinearOptions(in, config.rank).bias(false));
  torch::nn::Linear b(torch::nn::LinearOptions(config.rank, out).bias(false));
  a->to(on.device(), on.dtype().toScalarType());
  b->to(on.device(), on.dtype().toScalarType());
  {
    torch::NoGradGuard no_grad;
    b->weight.zero_();
  }
  a_ = projection.register_module("lora_A", a);
  b_ = projection.register_module("lora_B", b);
  scaling_ = config.Scaling();
  dropout_ = config.dropout;
}

torch::Tensor LoraBranch::Apply(torch::nn::Linear& projection, const torch::Tensor& x) const {
  torch::Tensor y = projection(x);
  if (!attached()) return y;
  torch::Tensor in = x.to(a_->weight.scalar_type());
  if (dropout_ > 0) in = torch::dropout(in, dropout_, a_->is_training());
  const torch::Tensor low_rank = torch::nn::functional::linear(in, a_->weight);
  return y + (torch::nn::functional::linear(low_rank, b_->weight) * scaling_).to(y.scalar_type());
}

}  // namespace kappa::model
