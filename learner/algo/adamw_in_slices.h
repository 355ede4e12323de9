// AdamW's update in slices: what torch::optim::AdamW::step() computes, on
// that optimizer's own state (so its save/load archive is unchanged), with
// the update's full-size temporaries cut to one slice.
//
// libtorch's step builds `exp_avg_sq.sqrt() / sqrt(bias_correction2)` as two
// temporaries the size of each parameter: 2 x 519 MiB on Qwen2.5-0.5B's
// [151936, 896] embedding, the update's whole peak above the weights, the
// gradient and the moments (bench/README.md, "Where kappa's peak memory
// is"). Here the denominator is built `slice_elements` at a time into one
// reused buffer; the moments and the weight decay are in place as before.
#pragma once

#include <torch/optim/adamw.h>

#include <cstdint>

namespace kappa::learner {

// One AdamW step over every parameter of `optimizer` with a defined
// gradient, equal element for element to optimizer.step(): decoupled weight
// decay p *= 1 - lr·wd, then m = β1·m + (1 − β1)·g, v = β2·v + (1 − β2)·g²,
// p -= lr / (1 − β1^t) · m / (sqrt(v) / sqrt(1 − β2^t) + ε), with t the
// parameter's step count (state created at the first step, as libtorch does).
// Mutates the parameters and the optimizer's state; runs under no-grad.
// REQUIRES: slice_elements > 0; dense gradients; amsgrad off (throws
// std::invalid_argument naming it otherwise: not implemented here).
void AdamWStepInSlices(torch::optim::AdamW& optimizer, int64_t slice_elements = int64_t{1} << 20);

// `optimizer`'s state of parameter `p`, or null before its first step.
const torch::optim::AdamWParamState* FindAdamWState(torch::optim::AdamW& optimizer,
                                                    const torch::Tensor& p);
// The same, made first (step 0, zero moments shaped like `p`) when absent,
// as libtorch makes it at a parameter's first step.
torch::optim::AdamWParamState& AdamWStateFor(torch::optim::AdamW& optimizer,
                                             const torch::Tensor& p);

// The same update of some elements: p (decayed, then stepped), its gradient
// g and moments m, v, all contiguous and of one shape, at the rate `lr`
// and the step count `step` (1 at the first update), the other
// hyperparameters from `options` (its lr is not read). What
// AdamWStepInSlices does to each parameter, and what a rank that holds the
// moments of a slice of the parameters only does to that slice
// (sharded_adamw.h). Mutates p, m and v; `denom_buffer` is scratch, grown
// to one slice as needed. REQUIRES: no grad mode; slice_elements > 0.
void AdamWUpdate(torch::Tensor p, const torch::Tensor& g, torch::Tensor m, torch::Tensor v,
                 const torch::optim::AdamWOptions& options, double lr, int64_t step,
                 int64_t slice_elements, torch::Tensor* denom_buffer);

}  // namespace kappa::learner
