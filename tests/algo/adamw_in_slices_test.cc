// AdamWStepInSlices against libtorch's own torch::optim::AdamW::step(): the
// same parameters and gradients, element for element, and the same state
// (libtorch's step continues from it as from its own).
#include "learner/algo/adamw_in_slices.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

namespace kappa::learner {
namespace {

// Leaves of several shapes: one spans many slices with a ragged last one,
// one is a transposed (non-contiguous) view, one gets no gradient.
std::vector<torch::Tensor> MakeParameters() {
  torch::manual_seed(3);
  return {torch::randn({37, 5}).requires_grad_(), torch::randn({11}).requires_grad_(),
          torch::randn({6, 4}).t().detach().requires_grad_(), torch::randn({3}).requires_grad_()};
}

std::vector<torch::Tensor> Copy(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// Step s's gradients: fixed random ones (the last parameter gets none).
void SetGradients(std::vector<torch::Tensor>& params, int step) {
  torch::manual_seed(100 + step);
  for (size_t i = 0; i + 1 < params.size(); ++i) {
    params[i].mutable_grad() = torch::randn(params[i].sizes()) * (1.0 + step);
  }
}

torch::optim::AdamWOptions Options() {
  return torch::optim::AdamWOptions(3e-2).weight_decay(0.1).betas({0.8, 0.95}).eps(1e-6);
}

TEST(AdamWInSlices, EqualsLibtorchsStepElementForElement) {
  std::vector<torch::Tensor> ours = MakeParameters();
  std::vector<torch::Tensor> theirs = Copy(ours);
  torch::optim::AdamW our_optimizer(ours, Options());
  torch::optim::AdamW their_optimizer(theirs, Options());
  for (int step = 0; step < 5; ++step) {
    SetGradients(ours, step);
    SetGradients(theirs, step);
    AdamWStepInSlices(our_optimizer, /*slice_elements=*/7);
    their_optimizer.step();
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(torch::equal(ours[i], theirs[i])) << "parameter " << i << " after step " << step;
    }
  }
  EXPECT_EQ(our_optimizer.state().size(), 3u);  // none for the parameter without a gradient
}

TEST(AdamWInSlices, LeavesTheStateLibtorchsStepContinuesFrom) {
  // Two steps in slices then one of libtorch's, against three of libtorch's:
  // equal only if libtorch finds and uses the moments and step counts.
  std::vector<torch::Tensor> mixed = MakeParameters();
  std::vector<torch::Tensor> plain = Copy(mixed);
  torch::optim::AdamW mixed_optimizer(mixed, Options());
  torch::optim::AdamW plain_optimizer(plain, Options());
  for (int step = 0; step < 3; ++step) {
    SetGradients(mixed, step);
    SetGradients(plain, step);
    if (step < 2) {
      AdamWStepInSlices(mixed_optimizer, /*slice_elements=*/16);
    } else {
      mixed_optimizer.step();
    }
    plain_optimizer.step();
  }
  for (size_t i = 0; i < mixed.size(); ++i) EXPECT_TRUE(torch::equal(mixed[i], plain[i])) << i;
}

TEST(AdamWInSlices, RefusesWhatItDoesNotImplementByName) {
  std::vector<torch::Tensor> params = MakeParameters();
  SetGradients(params, 0);
  torch::optim::AdamW amsgrad(params, Options().amsgrad(true));
  try {
    AdamWStepInSlices(amsgrad);
    FAIL() << "amsgrad accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("amsgrad"), std::string::npos) << e.what();
  }
  torch::optim::AdamW plain(params, Options());
  EXPECT_THROW(AdamWStepInSlices(plain, 0), std::invalid_argument);
}

}  // namespace
}  // namespace kappa::learner
