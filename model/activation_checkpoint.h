// Activation checkpointing for libtorch's C++ API, which (1.13) has no
// torch::utils::checkpoint: a segment of the network runs forward without
// keeping its intermediate activations, and is recomputed in backward.
#pragma once

#include <torch/types.h>

#include <functional>
#include <vector>

namespace kappa::model {

// Returns fn(input). With grad mode enabled, fn runs under no-grad and only
// `input` and `params` are kept for backward (references, not copies); the
// backward recomputes fn once from a detached copy of `input` and
// backpropagates through the recomputation into `input` and every one of
// `params` that requires grad. Without grad mode, it is fn(input) as is.
//
// Each backward pass through the result runs fn once more: a graph retained
// (backward(retain_graph=true), or torch::autograd::grad called per output)
// and traversed k times recomputes k times; the saved references stay valid
// until the graph is freed.
//
// The contract on fn:
//  - deterministic but for what it draws from the default random generators
//    (dropout, sampling), so the recomputation equals the forward: the
//    gradient is of the recomputed output. Its draws are reproduced: the
//    forward records the states of the CPU's default generator and, where
//    `input` is on CUDA, of that device's (as torch.utils.checkpoint's
//    preserve_rng_state=True does); each recomputation runs from those
//    states and then puts each generator back to the state it had before
//    the recomputation, so backward does not shift the random stream. A
//    generator fn takes by argument, or another device's, is not restored.
//    Another thread drawing from a default generator while a recomputation
//    runs shifts both threads' draws (as in PyTorch);
//  - differentiable only in `input` and `params`: any other tensor it
//    captures (masks, tables) must not require grad, else its gradient is
//    silently lost; a parameter missing from `params` gets none;
//  - `params` are not modified in place between the forward and the
//    backward (libtorch's version check throws c10::Error if they are);
//  - returns one tensor.
//
// Throws std::invalid_argument if fn is empty or input undefined; a backward
// through the result with create_graph=true (double backward) throws
// std::invalid_argument: the recomputation's gradients carry no graph.
torch::Tensor Checkpoint(std::function<torch::Tensor(const torch::Tensor&)> fn,
                         const torch::Tensor& input, const std::vector<torch::Tensor>& params);

}  // namespace kappa::model
