#!/usr/bin/python3
"""The hybrid learner step at a real vocabulary, the plain eager-PyTorch way.

The eager counterpart of bench/vocab_scale_bench.cc (kappa_bench_vocab_scale):
the same Qwen2.5-0.5B-shaped model (bench/qwen_shapes.h: d 896, ffn 4864,
14 query / 2 KV heads, V 151,936, tied embeddings, q/k/v biases, RoPE
theta 1e6) with --layers decoder layers, random fp32 weights on the CPU, the
same synthetic groups (--rows sequences of --prompt + --response tokens, G =
--group-size, 0/1 rewards mixed in every group, teacher rows
log_softmax(2 N(0, 1))), and the step a TRL-style user writes:

  logits [B, L, V] for every position, ONE log_softmax, everything read from
  it: the GRPO/PPO token loss (clip 0.2/0.28, dual clip 3, log-ratio +-20),
  the distillation term and the no-grad entropy; token means over the
  response positions; one backward of L_R + L_D (--kappa 1: autograd.grad of
  each apart, retain_graph for the first, their norms, then the sum);
  clip_grad_norm_(1.0); torch.optim.AdamW(lr 1e-7, weight_decay 0).
  No chunking of the vocabulary, no activation checkpointing.

--teacher full: reverse KL(p || q) over the vocabulary, q the [B, L, V]
teacher log-probs. --teacher topk: the teacher's top --topk ids S and their
log-probs, reverse KL of the (k + 1)-bucket distributions, the k ids plus one
tail bucket T holding the rest of each (docs/algorithms.md 2.2,
topk_tail_reverse_kl): sum_S p (log p - log q) + p_T (log p_T - log q_T),
p_T = 1 - sum_S p (floored at 1e-12), q_T = 1 - sum_S q (the teacher's tail,
floored the same way).

Written from these definitions, not ported from kappa's C++. Seeded draw for
draw like the C++ bench (torch.manual_seed(1) before the model, in the same
parameter order and with the same initializer calls; manual_seed(7) before
the batch), so the first step's losses match kappa's to rounding.

Runs with Debian's torch (python3-torch 1.13, the libtorch_cpu and OpenBLAS
the C++ bench links): /usr/bin/python3.

--device cuda (bench/gpu/run.sh, the GPU machine's own PyTorch) builds the
model and the batch on the CPU as above, then moves them; --precision bf16
runs the model's forward under bf16 autocast (the log_softmax and every
loss in float32), as a user's bf16 step does.

Usage: /usr/bin/python3 bench/eager_reference/vocab_step.py --teacher full|topk
         [--layers 24] [--rows 8] [--group-size 4] [--prompt 64]
         [--response 448] [--topk 64] [--steps 2] [--threads 2] [--kappa 0|1]
         [--device cpu|cuda] [--precision fp32|bf16] [--vocab V]
(--vocab shrinks the vocabulary for bench/gpu/run.sh's CPU rehearsal.)
Prints one JSON line (the keys of kappa_bench_vocab_scale's where they mean
the same): each step's wall and process CPU seconds, their medians over the
steps after the first (the first warms the allocator up), peak RSS
(getrusage ru_maxrss), and the first step's losses. A failed allocation
(e.g. under `ulimit -v`) prints {"oom": true, ...} and exits 3.
"""

import argparse
import ctypes
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hybrid_step import (CLIP_HIGH, CLIP_LOW, DUAL_CLIP, MAX_LOG_RATIO, Config,  # noqa: E402
                         Decoder, LlamaModel, masked_mean)

LAMBDA, MAX_GRAD_NORM, LR, ADV_EPS, TAIL_FLOOR = 1.0, 1.0, 1e-7, 1e-6, 1e-12


def qwen25_half_b(layers, vocab=151936):
    """Qwen2.5-0.5B's config.json shape with `layers` decoder layers."""
    return Config(vocab_size=vocab, hidden_size=896, intermediate_size=4864,
                  num_hidden_layers=layers, num_attention_heads=14, num_key_value_heads=2,
                  max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, qkv_bias=True)


class Qwen2Decoder(Decoder):
    """hybrid_step's decoder with Qwen2's q/k/v biases and tied embeddings:
    HF init (N(0, 0.02) weights, zero biases, norms 1) and HF's float32 RoPE
    tables. Built in the order of the C++ model, which also draws a 1x1
    placeholder head when the embeddings are tied."""

    def __init__(self, c):
        nn.Module.__init__(self)
        self.config = c
        self.model = LlamaModel(c)
        self.lm_head = None  # tied: the logits are F.linear(h, embed_tokens.weight)
        nn.Linear(1, 1, bias=False)  # the C++ model's placeholder head draws here
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm.weight" in name:
                    continue
                if name.endswith(".bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02)
        hd = c.head_dim
        # transformers' _compute_default_rope_parameters and rotary forward: float32.
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        freqs = torch.outer(torch.arange(c.max_position_embeddings, dtype=torch.int64).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos())
        self.register_buffer("rope_sin", emb.sin())


# ---- the batch ---------------------------------------------------------------

def synthetic_batch(a, vocab):
    """Groups drawn as kappa_bench_vocab_scale's SyntheticGroups draws them,
    laid out as one right-shifted batch: position t predicts token t + 1,
    the response predicted from position prompt - 1 on. Teacher rows go
    straight into the batch tensors (no per-sample copies)."""
    torch.manual_seed(7)
    full = a.teacher == "full"
    G, R, P = a.group_size, a.response, a.prompt
    B, L = a.rows, P + R - 1
    batch = dict(
        input_tokens=torch.zeros(B, L, dtype=torch.long),
        target_tokens=torch.zeros(B, L, dtype=torch.long),
        response_mask=torch.zeros(B, L),
        old_logprobs=torch.zeros(B, L),
    )
    if full:
        batch["teacher_logprobs"] = torch.zeros(B, L, vocab)
    else:
        batch["teacher_logprobs"] = torch.zeros(B, L, a.topk)
        batch["teacher_ids"] = torch.zeros(B, L, a.topk, dtype=torch.long)
    span = slice(P - 1, P - 1 + R)
    rewards = torch.zeros(B, dtype=torch.float64)
    for g in range(B // G):
        prompt = torch.randint(0, vocab, (P,), dtype=torch.int64)
        drawn = torch.randint(0, 2, (G,), dtype=torch.int64)
        for i in range(G):
            b = g * G + i
            response = torch.randint(0, vocab, (R,), dtype=torch.int64)
            behavior = -math.log(vocab) + 0.1 * torch.randn(R)  # ~ the random student's
            reward = int(drawn[i])
            if i == G - 1 and int(drawn.sum()) % G == 0:
                reward = 1 - reward  # all equal so far: mix the group
            rewards[b] = reward
            seq = torch.cat([prompt, response])
            batch["input_tokens"][b] = seq[:-1]
            batch["target_tokens"][b] = seq[1:]
            batch["response_mask"][b, span] = 1.0
            batch["old_logprobs"][b, span] = behavior
            for t in range(0, R, 64):
                n = min(64, R - t)
                rows = torch.log_softmax(2 * torch.randn(n, vocab), -1)
                at = slice(P - 1 + t, P - 1 + t + n)
                if full:
                    batch["teacher_logprobs"][b, at] = rows
                else:
                    values, ids = rows.topk(a.topk, -1)
                    batch["teacher_logprobs"][b, at] = values
                    batch["teacher_ids"][b, at] = ids
    # GRPO advantages: the reward minus its group's mean over the group's
    # (population) standard deviation + 1e-6, in float64.
    r = rewards.view(-1, G)
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, unbiased=False, keepdim=True) + ADV_EPS)
    batch["advantages"] = adv.view(B, 1).float().expand(B, L) * batch["response_mask"]
    if not full:
        # The teacher's tail mass outside its top k, as a teacher would send it.
        mass = batch["teacher_logprobs"].double().exp().sum(-1)
        batch["teacher_tail_logmass"] = (1 - mass).clamp_min(TAIL_FLOOR).log().float()
    return batch


# ---- the losses --------------------------------------------------------------

def losses(model, batch, teacher, bf16):
    """L_R, L_D (graph) and the mean entropy (no graph) from one log_softmax."""
    mask = batch["response_mask"]
    with torch.autocast(device_type=mask.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(batch["input_tokens"], torch.ones_like(mask, dtype=torch.bool))
    logprobs = F.log_softmax(logits.float(), -1)
    token_lp = logprobs.gather(-1, batch["target_tokens"].unsqueeze(-1)).squeeze(-1)

    # GRPO: PPO clipped surrogate, asymmetric clip, dual clip where A < 0.
    adv = batch["advantages"]
    ratio = (token_lp - batch["old_logprobs"]).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
    loss_r = torch.max(-adv * ratio, -adv * ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH))
    loss_r = torch.where(adv < 0, torch.min(loss_r, -DUAL_CLIP * adv), loss_r)

    q = batch["teacher_logprobs"]
    if teacher == "full":  # KL(p || q) over the vocabulary
        p = logprobs.exp()
        loss_d = (p * (logprobs - q)).sum(-1)
        with torch.no_grad():
            entropy = -(p * logprobs).sum(-1)
    else:  # top k ids + one tail bucket
        lp_s = logprobs.gather(-1, batch["teacher_ids"])
        p_s = lp_s.exp()
        p_tail = (1 - p_s.sum(-1)).clamp_min(TAIL_FLOOR)
        loss_d = (p_s * (lp_s - q)).sum(-1) + p_tail * (p_tail.log() - batch["teacher_tail_logmass"])
        with torch.no_grad():
            entropy = -(logprobs.exp() * logprobs).sum(-1)
    return masked_mean(loss_r, mask), masked_mean(loss_d, mask), masked_mean(entropy, mask).item()


class Step:
    def __init__(self, config, separate, device, bf16):
        torch.manual_seed(1)
        self.model = Qwen2Decoder(config).to(device)
        self.bf16 = bf16
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=LR, weight_decay=0.0)
        self.separate = separate

    def run(self, batch, teacher):
        L_R, L_D, entropy = losses(self.model, batch, teacher, self.bf16)
        stats = dict(reward_loss=L_R.item(), distill_loss=L_D.item(), entropy=entropy)
        self.opt.zero_grad(set_to_none=True)
        if self.separate:  # both gradients apart, for their norms (kappa)
            g_r = torch.autograd.grad(L_R, self.params, retain_graph=True)
            g_d = torch.autograd.grad(L_D, self.params)
            with torch.no_grad():
                rr = sum(g.double().pow(2).sum() for g in g_r)
                dd = sum(g.double().pow(2).sum() for g in g_d)
                for p, a, b in zip(self.params, g_r, g_d):
                    p.grad = a.add(b, alpha=LAMBDA)
            stats.update(reward_grad_norm=rr.sqrt().item(), distill_grad_norm=dd.sqrt().item(),
                         kappa=(rr / dd).sqrt().item())
        else:
            (L_R + LAMBDA * L_D).backward()
        stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM).item()
        self.opt.step()
        return stats


# ---- the run -----------------------------------------------------------------

def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return None


def set_threads(n):
    """libtorch's intra-op threads and OpenBLAS's own pool (which
    torch.set_num_threads does not reach), as bench/threads.h does."""
    torch.set_num_threads(n)
    try:
        ctypes.CDLL("libopenblas.so.0").openblas_set_num_threads(n)
    except (OSError, AttributeError):
        pass


def median(values):
    v = sorted(values)
    return v[len(v) // 2] if v else None  # the upper one for an even count, as the C++ benches


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", choices=["full", "topk"], required=True)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=448)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kappa", type=int, choices=[0, 1], default=0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--vocab", type=int, default=151936)
    a = ap.parse_args()
    if (a.layers < 1 or a.group_size < 2 or a.rows < a.group_size or a.rows % a.group_size
            or a.prompt < 1 or a.response < 1 or a.steps < 1 or a.topk < 1):
        ap.error("--group-size >= 2 dividing --rows; --layers/--prompt/--response/--steps/--topk >= 1")
    return a


def main():
    a = parse_args()
    if a.threads > 0:
        set_threads(a.threads)
    out = dict(side="eager", torch=torch.__version__, teacher=a.teacher, layers=a.layers,
               rows=a.rows, group_size=a.group_size, prompt=a.prompt, response=a.response,
               topk=a.topk, steps=a.steps, threads=torch.get_num_threads(), kappa_every=a.kappa,
               device=a.device, precision=a.precision)
    device = torch.device(a.device)
    progress = dict(phase="model", step_s=[], cpu_s=[])
    try:
        config = qwen25_half_b(a.layers, a.vocab)
        step = Step(config, bool(a.kappa), device, a.precision == "bf16")
        out["parameters"] = sum(p.numel() for p in step.params)
        out["rss_model_mib"] = status_mib("VmRSS")
        progress["phase"] = "batch"
        batch = {k: v.to(device) for k, v in synthetic_batch(a, config.vocab_size).items()}
        out["batch_positions"] = batch["input_tokens"].numel()
        out["teacher_bytes"] = sum(batch[k].numel() * batch[k].element_size()
                                   for k in ("teacher_logprobs", "teacher_ids", "teacher_tail_logmass")
                                   if k in batch)
        out["peak_rss_after_build_mib"] = peak_rss_mib()
        out["rss_batch_mib"] = status_mib("VmRSS")
        progress["phase"] = "step"
        first = None
        for s in range(a.steps):
            start, start_cpu = time.perf_counter(), time.process_time()
            stats = step.run(batch, a.teacher)
            if device.type == "cuda":
                torch.cuda.synchronize()
            progress["step_s"].append(time.perf_counter() - start)
            progress["cpu_s"].append(time.process_time() - start_cpu)
            print(f"step {s + 1}: {progress['step_s'][-1]:.1f} s (CPU {progress['cpu_s'][-1]:.1f} s), "
                  f"peak RSS {peak_rss_mib():.0f} MiB", file=sys.stderr)
            first = first or stats
    except (RuntimeError, MemoryError) as e:
        text = str(e)
        if not isinstance(e, MemoryError) and "alloc" not in text and "memory" not in text:
            raise
        print(f"out of memory ({progress['phase']} {len(progress['step_s']) + 1}): "
              f"{text.splitlines()[0] if text else 'MemoryError'}", file=sys.stderr)
        out.update(oom=True, phase=progress["phase"], oom_step=len(progress["step_s"]) + 1,
                   step_s=progress["step_s"], cpu_s=progress["cpu_s"], peak_rss_mib=peak_rss_mib(),
                   vm_peak_mib=status_mib("VmPeak"))
        print(json.dumps(out), flush=True)
        sys.exit(3)
    later = slice(1, None) if a.steps > 1 else slice(None)
    out.update(oom=False, step_s=progress["step_s"], cpu_s=progress["cpu_s"],
               median_step_s=median(progress["step_s"][later]),
               median_cpu_s=median(progress["cpu_s"][later]),
               last_step_s=progress["step_s"][-1], peak_rss_mib=peak_rss_mib(),
               vm_peak_mib=status_mib("VmPeak"), **first)
    if device.type == "cuda":
        out["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
