#!/usr/bin/python3
"""Checks that a checkpoint kappa wrote is a Hugging Face model directory the reference loads.

The reference is tests/model/reference/hf_forward.py (written from the transformers modeling
code, never from kappa's C++); this script adds what a user loading the directory with
AutoModelForCausalLM / AutoTokenizer relies on:
  (a) config.json resolves to a supported architecture (Llama, Qwen2, Qwen3);
  (b) the safetensors hold exactly the tensors HF expects (no missing, no extra name), each
      finite, the embedding [vocab_size, hidden_size];
  (c) the tokenizer files are there (tokenizer.json, tokenizer_config.json), byte for byte those
      of --tokenizer-from when given;
  (d) the reference's fp32 logits for the ids of --kappa-logits equal kappa's (the output of
      `kappa logits MODEL_DIR --ids ...`) within --tolerance + --rtol x (the position's largest
      |reference logit|) + --ulp-factor x (the position's float32 sensitivity) at every position
      and id. The sensitivity (--ulp-trials N > 0) is how far the reference's own logits move
      when every weight is perturbed by about one float32 ulp, the largest of N such trials: a
      deep model with near-tied attention scores (a random 24-layer model after a few steps)
      amplifies rounding to ~1e-3 of the logit scale, where any two float32 implementations
      disagree by as much, while a weight that is wrong (missing, transposed, rounded to
      bf16: ~65,000 ulps) moves the logits by orders of magnitude more;
  (e) with --initial DIR, the weights differ from DIR's (the run trained them).

Usage:
  /usr/bin/python3 tests/integration/check_hf_checkpoint.py MODEL_DIR --kappa-logits FILE \
      [--tokenizer-from DIR] [--initial DIR] [--tolerance 1e-4] [--rtol 0] \
      [--ulp-trials 0] [--ulp-factor 4]
stdout: one JSON object with what was measured. Exit 0: every check passed; 1: one failed
(stderr names it); 2: unsupported config.
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model", "reference"))
import hf_forward as hf  # noqa: E402


class Failed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failed(message)


def check_tensors(p, weights):
    need = hf.expected_tensor_names(p)
    missing = sorted(set(need) - set(weights))
    extra = sorted(set(weights) - set(need))
    check(not missing, f"missing tensors: {missing[:5]}")
    check(not extra, f"tensors HF would not load: {extra[:5]}")
    embed = weights["model.embed_tokens.weight"]
    check(list(embed.shape) == [p["vocab"], p["hidden"]],
          f"model.embed_tokens.weight is {list(embed.shape)}, config says "
          f"[{p['vocab']}, {p['hidden']}]")
    for name, tensor in weights.items():
        check(bool(torch.isfinite(tensor).all()), f"{name} holds non-finite values")


def check_tokenizer(model_dir, source_dir):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = os.path.join(model_dir, name)
        check(os.path.isfile(path), f"{path}: no such file (AutoTokenizer needs it)")
        if source_dir:
            with open(path, "rb") as a, open(os.path.join(source_dir, name), "rb") as b:
                check(a.read() == b.read(), f"{path} differs from {source_dir}/{name}")


def ulp_sensitivity(p, weights, ids, reference, trials):
    """Per position, the largest |logit change| of the reference over `trials` forwards whose
    weights are each multiplied by (1 + 2^-24 x N(0, 1)): about one float32 ulp of noise."""
    generator = torch.Generator().manual_seed(0)
    largest = torch.zeros(len(ids), dtype=torch.float64)
    for _ in range(trials):
        perturbed = {n: (t.double() * (1 + 2.0 ** -24 * torch.randn(t.shape, generator=generator,
                                                                     dtype=torch.float64))).float()
                     for n, t in weights.items()}
        moved = hf.forward(p, perturbed, torch.tensor([ids]), torch.ones(1, len(ids),
                                                                         dtype=torch.long))
        largest = torch.maximum(largest, (moved[0].double() - reference).abs().max(1).values)
    return largest


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--kappa-logits", required=True)
    parser.add_argument("--tokenizer-from", default="")
    parser.add_argument("--initial", default="")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--rtol", type=float, default=0.0)
    parser.add_argument("--ulp-trials", type=int, default=0)
    parser.add_argument("--ulp-factor", type=float, default=4.0)
    args = parser.parse_args(argv[1:])
    try:
        p = hf.resolve(hf.load_config(args.model_dir))
        weights = hf.load_weights(args.model_dir)
        check_tensors(p, weights)
        check_tokenizer(args.model_dir, args.tokenizer_from)

        with open(args.kappa_logits) as f:
            printed = json.load(f)
        ids = printed["ids"]
        kappa = torch.tensor(printed["logits"], dtype=torch.float64)
        check(list(kappa.shape) == [len(ids), p["vocab"]],
              f"kappa's logits are {list(kappa.shape)}, want [{len(ids)}, {p['vocab']}]")
        with torch.no_grad():
            reference = hf.forward(p, weights, torch.tensor([ids]), torch.ones(1, len(ids),
                                                                               dtype=torch.long))
        diff = (reference[0].double() - kappa).abs()
        max_diff = float(diff.max())
        row_scale = reference[0].double().abs().max(1, keepdim=True).values
        allowed = args.rtol * row_scale
        if args.ulp_trials > 0:
            with torch.no_grad():
                sensitivity = ulp_sensitivity(p, weights, ids, reference[0].double(),
                                              args.ulp_trials)
            allowed = allowed + args.ulp_factor * sensitivity[:, None]
        excess = diff - allowed
        report = {"model_type": p["model_type"], "vocab": p["vocab"], "hidden": p["hidden"],
                  "tensors": len(weights), "positions": len(ids), "max_abs_diff": max_diff,
                  "logit_scale": float(reference.abs().max())}
        report["max_diff_over_row_scale"] = float((diff / row_scale.clamp_min(1e-30)).max())
        if args.ulp_trials > 0:
            report["ulp_sensitivity"] = [float(v) for v in sensitivity]
            report["max_diff_over_sensitivity"] = float(
                (diff.max(1).values / sensitivity.clamp_min(1e-30)).max())
        check(float(excess.max()) <= args.tolerance,
              f"kappa's logits differ from the reference's by {max_diff:.3g} > {args.tolerance}"
              f" + {args.rtol} x the position's logit scale"
              + (f" + {args.ulp_factor} x its float32 sensitivity" if args.ulp_trials > 0 else "")
              + f" (position {int(excess.max(1).values.argmax())})")

        if args.initial:
            initial = hf.load_weights(args.initial)
            check(set(initial) == set(weights), "the initial checkpoint has other tensors")
            change = max(float((weights[n] - initial[n]).abs().max()) for n in weights)
            report["max_weight_change"] = change
            check(change > 0, f"the weights equal {args.initial}'s: nothing was trained")
    except hf.Unsupported as e:
        print(f"check_hf_checkpoint: unsupported config: {e}", file=sys.stderr)
        return 2
    except Failed as e:
        print(f"check_hf_checkpoint: {args.model_dir}: {e}", file=sys.stderr)
        return 1
    json.dump(report, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
