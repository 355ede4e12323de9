#include "model/activation_checkpoint.h"

#include <ATen/Context.h>
#include <torch/torch.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/autocast_state.h"

namespace kappa::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The states of the default random generators a segment on `device` draws
// from: the CPU's always, and that CUDA device's where the segment's input
// is on CUDA (torch.utils.checkpoint's preserve_rng_state=True saves the
// same). Each generator is read and written under its mutex.
class RngStates {
 public:
  static RngStates Capture(const torch::Device& device) {
    RngStates states;
    states.Add(at::globalContext().defaultGenerator(torch::kCPU));
    if (device.is_cuda()) states.Add(at::globalContext().defaultGenerator(device));
    return states;
  }

  // The same generators' states now (to put back afterwards).
  RngStates Current() const {
    RngStates states;
    for (const Entry& e : entries_) states.Add(e.generator);
    return states;
  }

  // Sets every generator to its captured state.
  void Restore() const {
    for (const Entry& e : entries_) {
      at::Generator generator = e.generator;
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(e.state);
    }
  }

 private:
  struct Entry {
    at::Generator generator;
    torch::Tensor state;
  };

  void Add(at::Generator generator) {
    torch::Tensor state;
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      state = generator.get_state();
    }
    entries_.push_back({std::move(generator), std::move(state)});
  }

  std::vector<Entry> entries_;
};

// Runs with the generators set to `forward`'s states for its lifetime and
// puts back the states they had before, so a recomputation draws the
// forward's random numbers (dropout masks) and leaves the global stream
// where it found it.
class ScopedRngStates {
 public:
  explicit ScopedRngStates(const RngStates& forward) : outer_(forward.Current()) {
    forward.Restore();
  }
  ~ScopedRngStates() { outer_.Restore(); }
  ScopedRngStates(const ScopedRngStates&) = delete;
  ScopedRngStates& operator=(const ScopedRngStates&) = delete;

 private:
  RngStates outer_;
};

// The segment to recompute, held by the autograd node. AutogradContext keeps
// only IValues, so it travels as a capsule (the one IValue that holds an
// arbitrary C++ object without registering a TorchScript class). The
// forward sets `rng` to the generators' states before fn ran.
struct Recompute : torch::CustomClassHolder {
  explicit Recompute(std::function<torch::Tensor(const torch::Tensor&)> f) : fn(std::move(f)) {}
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  RngStates rng;
};

constexpr const char* kRecompute = "kappa_recompute";

// Forward inputs, in order: input, params (one variable each), the
// Recompute (not a variable). backward returns one gradient per forward
// input in the same order, undefined for the Recompute and for whatever
// does not require grad.
class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               at::TensorList params, c10::intrusive_ptr<Recompute> recompute) {
    // Before fn draws: the recomputation replays these states.
    recompute->rng = RngStates::Capture(input.device());
    torch::Tensor out;
    {
      torch::NoGradGuard no_grad;  // Function::apply already disables grad; explicit here
      out = recompute->fn(input);
    }
    if (!out.defined()) throw std::invalid_argument("Checkpoint: fn returned an undefined tensor");
    // A view of a tensor created under no-grad cannot take a grad_fn safely.
    if (out.is_view()) out = out.clone();
    variable_list saved{input};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data[kRecompute] = c10::IValue::make_capsule(std::move(recompute));
    // The recomputation runs under this forward's autocast state (as
    // torch.utils.checkpoint does): bf16 GEMMs stay bf16 in backward.
    ctx->saved_data["autocast"] = AutocastState::Current(input.device().type()).Encode();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // The engine runs a node's backward with grad mode = create_graph.
    if (torch::GradMode::is_enabled()) {
      throw std::invalid_argument(
          "Checkpoint: backward with create_graph=true (double backward) is not supported");
    }
    // Throws if the graph was freed (a second backward without
    // retain_graph) or a saved tensor was modified in place.
    const variable_list saved = ctx->get_saved_variables();
    auto recompute =
        c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data.at(kRecompute).toCapsule());
    const size_t n_params = saved.size() - 1;
    variable_list grads(saved.size() + 1);  // + the Recompute's (undefined)

    torch::Tensor input = saved[0].detach().requires_grad_(saved[0].requires_grad());
    variable_list wrt;
    std::vector<size_t> slot;  // wrt[k] is forward input slot[k]
    if (input.requires_grad()) {
      wrt.push_back(input);
      slot.push_back(0);
    }
    for (size_t i = 0; i < n_params; ++i) {
      if (saved[1 + i].requires_grad()) {
        wrt.push_back(saved[1 + i]);
        slot.push_back(1 + i);
      }
    }
    if (wrt.empty()) return grads;

    torch::Tensor out;
    {
      torch::AutoGradMode grad_mode(true);
      const AutocastScope forward_autocast(
          input.device().type(), AutocastState::Decode(ctx->saved_data.at("autocast").toInt()));
      const ScopedRngStates forward_rng(recompute->rng);
      out = recompute->fn(input);
    }
    if (!out.requires_grad()) return grads;  // fn does not depend on what requires grad
    const variable_list g = torch::autograd::grad({out}, wrt, {grad_outputs[0]},
                                                  /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < g.size(); ++k) grads[slot[k]] = g[k];
    return grads;
  }
};

}  // namespace

torch::Tensor Checkpoint(std::function<torch::Tensor(const torch::Tensor&)> fn,
                         const torch::Tensor& input, const std::vector<torch::Tensor>& params) {
  if (!fn) throw std::invalid_argument("Checkpoint: fn is empty");
  if (!input.defined()) throw std::invalid_argument("Checkpoint: input is undefined");
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined()) {
      throw std::invalid_argument("Checkpoint: params[" + std::to_string(i) + "] is undefined");
    }
  }
  if (!torch::GradMode::is_enabled()) return fn(input);
  return CheckpointFunction::apply(input, at::TensorList(params),
                                   c10::make_intrusive<Recompute>(std::move(fn)));
}

}  // namespace kappa::model
