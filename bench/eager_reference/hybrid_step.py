#!/usr/bin/python3
"""kappa's hybrid learner step, written the plain eager PyTorch way.

A reference for bench/learner_step_bench.cc (kappa_bench_learner_step): the
same Llama-style decoder (model/transformer.cc), the same synthetic batch
(SyntheticGroups + BuildTrainBatch), the same losses (learner/algo: one
log_softmax shared by the PPO token loss, the reverse KL to the full teacher
rows and the no-grad entropy; token-mean aggregation) and the same update
(global-norm clipping to 1.0, AdamW lr 1e-7, weight decay 0), in the two modes
of the bench that have a plain-PyTorch counterpart:

  plain   one backward pass of L_R + lambda L_D (lambda = 1)
  kappa   separate gradients of L_R and L_D (retain_graph for the first),
          their norms and cosine, then their sum

Written as an engineer would in eager PyTorch (nn.Module, autograd.grad per
signal, clip_grad_norm_, torch.optim.AdamW), not as a port of kappa's
implementation details (flat gradient buffers, one host transfer per step).

Runs with Debian's torch (python3-torch 1.13, the same libtorch_cpu and
OpenBLAS the C++ bench links): /usr/bin/python3, not a pyenv python.

Usage: /usr/bin/python3 bench/eager_reference/hybrid_step.py
         [--model demo|large|gpt] [--modes plain,kappa] [--reps N] [--threads T]
         [--device cpu|cuda]
Prints each mode's first-step numbers (seeded like the C++ bench, so they
match kappa's to float rounding: check_numbers.sh) and the per-mode medians
in the format of kappa_bench_learner_step. compare.sh times both side by side.
"""

import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- model (model/transformer.cc) -------------------------------------------

class Config:
    def __init__(self, **kw):
        self.vocab_size = 51
        self.hidden_size = 64
        self.intermediate_size = 176
        self.num_hidden_layers = 2
        self.num_attention_heads = 4
        self.num_key_value_heads = 4
        self.max_position_embeddings = 64
        self.rope_theta = 10000.0
        self.rms_norm_eps = 1e-6
        self.tie_word_embeddings = False
        self.__dict__.update(kw)

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.to(torch.float32)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        bias = getattr(c, "qkv_bias", False)  # Qwen2: q/k/v projections have biases
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # HF repeat_kv: query head h reads KV head h // group.
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, self.heads * self.head_dim)
        return self.o_proj(out)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = Mlp(c)

    def forward(self, h, cos, sin, mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Decoder(nn.Module):
    """Parameter names, registration order and initialization as kappa's
    DecoderImpl, so torch.manual_seed(1) gives the same weights."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = LlamaModel(c)
        if c.tie_word_embeddings:
            self.lm_head = None  # F.linear with the embedding, as kappa
        else:
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        with torch.no_grad():  # HF _init_weights: N(0, 0.02), norms stay 1
            for name, p in self.named_parameters():
                if "layernorm" not in name and "norm.weight" not in name:
                    p.normal_(0.0, 0.02)
        hd = c.head_dim
        inv_freq = 1.0 / torch.pow(c.rope_theta, torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        freqs = torch.outer(torch.arange(c.max_position_embeddings, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos().to(torch.float32))
        self.register_buffer("rope_sin", emb.sin().to(torch.float32))

    def forward(self, tokens, attention_mask):
        B, T = tokens.shape
        # Right-padded rows: every real token sits at its index (HF's default
        # position_ids); padding rows attend to nothing new and are masked out
        # of the losses.
        cos = self.rope_cos[:T].view(1, 1, T, -1)
        sin = self.rope_sin[:T].view(1, 1, T, -1)
        causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
        mask = (causal.unsqueeze(0) & attention_mask.unsqueeze(1)).unsqueeze(1)  # [B, 1, T, T]
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = layer(h, cos, sin, mask)
        h = self.model.norm(h)
        if self.lm_head is None:
            return F.linear(h, self.model.embed_tokens.weight)
        return self.lm_head(h)


# ---- batch (bench/learner_step_bench.cc, learner/algo/train_batch.cc) -------

SHAPES = {
    # GPT-2-small-sized: 12 layers, d=768, 16 sequences of 1024 tokens, V=32000.
    "gpt": dict(config=dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                            num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
                            max_position_embeddings=1024),
                groups=2, group_size=8, prompt_len=256, response_len=768),
    # configs/demo.yaml's student on the demo's batch: 8 groups x G=8.
    "demo": dict(config=dict(hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=16),
                 groups=8, group_size=8, prompt_len=7, response_len=5),
    # 8 layers, d=512, sequences of 256 tokens.
    "large": dict(config=dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                              num_attention_heads=8, num_key_value_heads=4,
                              max_position_embeddings=256),
                  groups=2, group_size=4, prompt_len=56, response_len=200),
}


def plain_step_flops(c, rows, seq):
    """The C++ bench's PlainStepFlops: 3x the forward's 2 FLOPs per weight
    multiply-add (embedding lookup excluded) plus causal attention."""
    d = c.hidden_size
    kv = d / c.num_attention_heads * c.num_key_value_heads
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * c.intermediate_size
    matmul_params = c.num_hidden_layers * per_layer + d * c.vocab_size
    attention = c.num_hidden_layers * 2.0 * seq * d
    return 3.0 * rows * seq * (2.0 * matmul_params + attention)


def synthetic_batch(shape, vocab):
    """SyntheticGroups then BuildTrainBatch(groups, norm_std=true, pad_id=0)."""
    torch.manual_seed(7)  # the same generator and randn calls as the C++ bench
    G, n = shape["group_size"], shape["groups"]
    rows = []
    for g in range(n):
        prompt = [1] + [3 + (g * 7 + k) % 40 for k in range(1, shape["prompt_len"])]
        for i in range(G):
            length = shape["response_len"] - i % 3
            response = [3 + (g + 5 * i + 3 * k) % 45 for k in range(length)]
            teacher = torch.log_softmax(2 * torch.randn(length, vocab), -1)
            rows.append((prompt, response, [-2.0] * length, float((g + i) % 2), teacher))
    B = len(rows)
    L = max(len(p) + len(r) for p, r, *_ in rows) - 1
    rewards = torch.tensor([r[3] for r in rows]).view(n, G)
    centered = rewards - rewards.mean(1, keepdim=True)
    group_adv = (centered / (rewards.std(1, unbiased=False, keepdim=True) + 1e-6)).view(-1)
    batch = dict(
        input_tokens=torch.zeros(B, L, dtype=torch.long),
        target_tokens=torch.zeros(B, L, dtype=torch.long),
        attention_mask=torch.zeros(B, L, dtype=torch.bool),
        response_mask=torch.zeros(B, L),
        old_logprobs=torch.zeros(B, L),
        advantages=torch.zeros(B, L),
        teacher_logprobs=torch.zeros(B, L, vocab),
    )
    for b, (prompt, response, behavior, _, teacher) in enumerate(rows):
        seq = prompt + response
        n_in = len(seq) - 1
        batch["input_tokens"][b, :n_in] = torch.tensor(seq[:-1])
        batch["target_tokens"][b, :n_in] = torch.tensor(seq[1:])
        batch["attention_mask"][b, :n_in] = True
        first = len(prompt) - 1  # response token k is predicted at first + k
        span = slice(first, first + len(response))
        batch["response_mask"][b, span] = 1.0
        batch["old_logprobs"][b, span] = torch.tensor(behavior)
        batch["advantages"][b, span] = group_adv[b]
        batch["teacher_logprobs"][b, span] = teacher
    return batch


# ---- losses (learner/algo/losses.cc, hybrid_loss.cc) -----------------------

CLIP_LOW, CLIP_HIGH, DUAL_CLIP, MAX_LOG_RATIO = 0.2, 0.28, 3.0, 20.0


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum().clamp(min=1)


def hybrid_losses(model, batch):
    logits = model(batch["input_tokens"], batch["attention_mask"])
    logprobs = torch.log_softmax(logits, dim=-1)  # shared by every term
    token_lp = logprobs.gather(-1, batch["target_tokens"].unsqueeze(-1)).squeeze(-1)
    mask, adv, old = batch["response_mask"], batch["advantages"], batch["old_logprobs"]

    # GRPO / PPO token loss, asymmetric clip, dual clip for negative advantages.
    log_ratio = (token_lp - old).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = log_ratio.exp()
    loss_r = torch.max(-adv * ratio, -adv * ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH))
    loss_r = torch.where(adv < 0, torch.min(loss_r, -DUAL_CLIP * adv), loss_r)
    # Reverse KL(p || q) to the teacher over the full vocabulary.
    loss_d = (logprobs.exp() * (logprobs - batch["teacher_logprobs"])).sum(-1)

    L_R, L_D = masked_mean(loss_r, mask), masked_mean(loss_d, mask)
    with torch.no_grad():  # the step's diagnostics, as kappa reports them
        lp = logprobs.detach()
        entropy = -(lp.exp() * lp).sum(-1)
        lr_ = log_ratio.detach()
        r = lr_.exp()
        clipped = ((-adv * r.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH)) > (-adv * r)).float()
        diag = torch.stack([masked_mean(entropy, mask), masked_mean(clipped, mask),
                            masked_mean((r - 1) - lr_, mask)]).tolist()
    return L_R, L_D, diag


# ---- one step (learner/algo/optimizer_step.cc) ------------------------------

LAMBDA, MAX_GRAD_NORM, LR = 1.0, 1.0, 1e-7


class Step:
    def __init__(self, config, separate, device):
        torch.manual_seed(1)  # as the C++ bench, per mode
        self.model = Decoder(config).to(device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=LR, weight_decay=0.0)
        self.separate = separate

    def run(self, batch):
        L_R, L_D, diag = hybrid_losses(self.model, batch)
        stats = dict(L_R=L_R.item(), L_D=L_D.item(), entropy=diag[0])
        self.opt.zero_grad(set_to_none=True)
        if self.separate:
            g_r = torch.autograd.grad(L_R, self.params, retain_graph=True)
            g_d = torch.autograd.grad(L_D, self.params)
            with torch.no_grad():
                rr = sum(g.pow(2).sum() for g in g_r)
                dd = sum(g.pow(2).sum() for g in g_d)
                rd = sum((a * b).sum() for a, b in zip(g_r, g_d))
                for p, a, b in zip(self.params, g_r, g_d):
                    p.grad = a.add(b, alpha=LAMBDA)
            stats.update(grad_norm_R=rr.sqrt().item(), grad_norm_D=dd.sqrt().item(),
                         cosine=(rd / (rr * dd).sqrt()).item())
        else:
            (L_R + LAMBDA * L_D).backward()
        stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM).item()
        self.opt.step()
        return stats


MODES = {"plain": False, "kappa": True}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo", choices=sorted(SHAPES))
    ap.add_argument("--modes", default="plain,kappa")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            sys.exit(f"unknown mode '{m}' (plain | kappa)")
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    shape = SHAPES[args.model]
    config = Config(**shape["config"])
    device = torch.device(args.device)
    batch = {k: v.to(device) for k, v in synthetic_batch(shape, config.vocab_size).items()}
    steps = {m: Step(config, MODES[m], device) for m in modes}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    n_params = sum(p.numel() for p in steps[modes[0]].params)

    seconds = {m: [] for m in modes}
    cpu = {m: [] for m in modes}  # process CPU time, robust to other load
    first = {}
    for rep in range(-2, args.reps):  # two warm-up rounds, modes interleaved
        for m in modes:
            sync()
            start, start_cpu = time.perf_counter(), time.process_time()
            stats = steps[m].run(batch)
            sync()
            s = time.perf_counter() - start
            if rep >= 0:
                cpu[m].append(time.process_time() - start_cpu)
            first.setdefault(m, stats)
            if rep >= 0:
                seconds[m].append(s)
            print(f"\rround {rep + 1}/{args.reps} {m:<10} {s:.3f} s   ", end="", file=sys.stderr)
    print(file=sys.stderr)

    print(f"eager torch={torch.__version__} params={n_params}")
    for m in modes:
        print(f"step1 {m}: " + " ".join(f"{k}={v:.9g}" for k, v in first[m].items()))
    B, L = batch["input_tokens"].shape
    flops = plain_step_flops(config, B, L)
    print(f"model={args.model} device={args.device} precision=fp32 threads={torch.get_num_threads()} "
          f"rows={B} seq={L} reps={args.reps} plain-step model GFLOP={flops / 1e9:.1f}")
    base = seconds["plain"] if "plain" in modes else seconds[modes[0]]
    med = lambda v: sorted(v)[len(v) // 2]  # the C++ bench's median (upper one for even n)
    mean = lambda v: sum(v) / len(v)
    print(f"{'mode':<10} {'median_ms':>10} {'ratio':>8} {'mean_ms':>10} {'ratio':>8} "
          f"{'tokens/s':>12} {'TFLOP/s':>8} {'MFU':>6}")
    for m in modes:
        t, a = med(seconds[m]), mean(seconds[m])
        print(f"{m:<10} {1e3 * t:10.3f} {t / med(base):8.3f} {1e3 * a:10.3f} {a / mean(base):8.3f} "
              f"{B * L / a:12.0f} {flops / a / 1e12:8.3g} {'-':>6}")
    print("cpu_median_ms " + " ".join(f"{m}={1e3 * med(cpu[m]):.3f}" for m in modes))

if __name__ == "__main__":
    main()
