"""The vocabulary head's three GEMMs and its per-position work, timed alone
(bench/README.md, "The per-position head"): at Qwen2.5-0.5B's V = 151,936
and d = 896, for 1,792 response positions in chunks of N rows, the seconds
of the logits GEMM h Wᵀ, the ∂/∂h GEMM dz W, the ∂/∂W accumulation
dW += dzᵀ h, and one chunk's elementwise passes of the top-64 + tail step
(log-softmax, entropy, both logit gradients), each scaled to all 1,792
positions. Plain PyTorch, nothing of kappa's: the floor the fused head's
forward is compared with.

  /usr/bin/python3 bench/eager_reference/head_gemm_timing.py 64
  /usr/bin/python3 bench/eager_reference/head_gemm_timing.py 256
"""
import ctypes
import sys
import time

import torch

torch.set_num_threads(2)
try:  # OpenBLAS's own pool, which torch.set_num_threads does not reach
    ctypes.CDLL("libopenblas.so.0").openblas_set_num_threads(2)
except OSError:
    pass
V, D, T = 151936, 896, 1792
n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
torch.manual_seed(0)
W = torch.randn(V, D) * 0.02
H = torch.randn(T, D)
dW = torch.zeros(V, D)
ids = torch.randint(0, V, (n, 64))
q = torch.log_softmax(torch.randn(n, 64), -1) - 0.1
tail = torch.full((n,), -3.0)


def rows(i):
    return H[(i * n) % T:(i * n) % T + n]


def timed(f):
    """Seconds for T positions: T / n calls after one warm-up."""
    reps = max(1, T // n)
    f(0)
    start = time.perf_counter()
    for i in range(reps):
        f(i)
    return (time.perf_counter() - start) / reps * (T / n)


S = torch.matmul(rows(0), W.t())
dz = torch.randn(n, V)


def elementwise(_):
    lp = S - S.logsumexp(-1, keepdim=True)
    p = lp.exp()
    _entropy = -(p * lp).sum(-1)
    set_lp = lp.gather(-1, ids)
    tail_lp = torch.log1p(-set_lp.exp().sum(-1).clamp(max=1 - 1e-6))
    tail_ratio = tail_lp - tail
    set_ratio = set_lp - q
    kl = ((set_lp.exp() * set_ratio).sum(-1) + tail_lp.exp() * tail_ratio).unsqueeze(-1)
    ratio = tail_ratio.unsqueeze(-1).expand_as(lp).contiguous().scatter_(-1, ids, set_ratio)
    g_d = lp.exp() * (ratio - kl)
    g_d.mul_(0.5)
    _kernel = (p * g_d).sum(-1)
    g_r = (p * -0.3).scatter_add_(-1, ids[:, :1], torch.full((n, 1), 0.3))
    return g_r.add_(g_d, alpha=0.5)


print(f"chunk {n} rows, seconds for {T} positions:")
print(f"  logits GEMM h W^T     {timed(lambda i: torch.matmul(rows(i), W.t())):.2f}")
print(f"  dh GEMM dz W          {timed(lambda i: torch.matmul(dz, W)):.2f}")
print(f"  dW += dz^T h          {timed(lambda i: dW.addmm_(dz.t(), rows(i))):.2f}")
print(f"  per-position passes   {timed(elementwise):.2f}")
