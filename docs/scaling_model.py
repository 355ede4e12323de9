#!/usr/bin/env python3
"""The throughput model of docs/scaling.md, as arithmetic (python3, stdlib only).

    python3 docs/scaling_model.py                 # prints every table of docs/scaling.md
    python3 docs/scaling_model.py --check docs/scaling.md
                                                  # exit 1 unless each table appears there verbatim

Every input is named below and is either MEASURED (bench/README.md, the
section given) or an ESTIMATE (first principles or a hardware spec sheet);
docs/scaling.md explains each one. Change an input here, run without
arguments, paste the tables into docs/scaling.md (the ctest
`docs_scaling_model` runs --check, so the two cannot drift apart).
"""
import argparse
import math
import sys

# ---------------------------------------------------------------- hardware (one H200)
F_BF16 = 790e12        # FLOP/s, bf16 dense matmul: measured on the project's H200 (issue 7), not in bench/README.md
HBM_BW = 4.8e12        # B/s, HBM3e: spec sheet
HBM = 141e9            # B: spec sheet
HBM_USABLE = 0.9       # ESTIMATE: fraction of HBM usable for weights + KV/logits (allocator, workspace)
PCIE = 50e9            # B/s device->host: ESTIMATE (PCIe Gen5 x16 is 64 GB/s per direction on paper)

# ---------------------------------------------------------------- efficiencies (ESTIMATES)
ETA_TRAIN = 0.40       # training MFU (bf16, large batch, fused kernels)
ETA_PREFILL = 0.50     # teacher scoring MFU (one forward, large batch)
ETA_DECODE_BW = 0.70   # fraction of HBM bandwidth a decode step reaches
ETA_DECODE_F = 0.50    # MFU of a decode step once compute-bound
T_OVH_EAGER = 5e-3     # s per decode step: libtorch eager, ~35 kernels x 28 layers x ~5 us launch/dispatch
T_OVH_ENGINE = 0.5e-3  # s per decode step: CUDA-graph-class engine
B_ENGINE_CAP = 512     # sequences decoded at once by a batched engine (a scheduling choice)
WORKER_ITEMS = 16      # rollout.max_outstanding set for such a run (configs/ ship 2): kappa's worker
                       # decodes the items it holds as one batch of WORKER_ITEMS x G rows

# ---------------------------------------------------------------- measured (bench/README.md)
KAPPA_EVERY_STEP = 1.53   # "Learner step", H200, large, kappa_kdr, ratio of means
KAPPA_EVERY_4 = 1.18      # "Learner step", H200, large, kappa4_kdr, ratio of means
GRPC_GBPS = 0.65e9        # "Transport", grpc (encode every call), 16 MiB tensor, loopback, 2-core CPU
TCP_GBPS = 1.31e9         # "Transport", raw loopback TCP
# "Teacher responses: bytes per response token", V = 151936
PAYLOAD = [("full", "fp32", 607744.1), ("full", "bf16", 303872.1),
           ("topk (k=64)", "fp32", 512.1), ("topk (k=64)", "bf16", 384.1),
           ("sampled", "fp32", 4.1), ("sampled", "bf16", 2.1)]
SAMPLE_OVERHEAD = 8.0     # ESTIMATE: B/token besides the teacher: token id varint + fp32 behavior log-prob
MAX_MESSAGE = 64 << 20    # security.max_message_bytes default (services/config.h)


class Model:
    def __init__(self, name, n, layers, heads, kv_heads, head_dim, vocab):
        self.name, self.n, self.layers = name, n, layers
        self.d_attn = heads * head_dim
        self.kv_heads, self.head_dim, self.vocab = kv_heads, head_dim, vocab

    def kv_bytes(self, dtype_bytes=2):  # K and V of every layer, one token
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def attn_flops(self, context):  # forward, one token attending to `context` positions
        return 4 * self.layers * self.d_attn * context


# Public configs of Qwen2.5-1.5B / Qwen2.5-7B (architecture only; kappa loads no such checkpoint).
STUDENT = Model("1.5B", 1.54e9, 28, 12, 2, 128, 151936)
TEACHER = Model("7B", 7.62e9, 28, 28, 4, 128, 152064)

P = 256                      # prompt tokens
GS = (4, 8, 16)
TS = (512, 2048, 8192)       # response tokens (every response assumed to run to T)
SAMPLES_PER_STEP = 512       # Q x G (trainer.groups_per_step x trainer.group_size)


def learner_rate(t, f_kappa, m=STUDENT):
    """Response tokens/s one learner GPU trains: forward+backward over prompt+response."""
    s = P + t
    per_position = 6 * m.n + 3 * m.attn_flops(s / 2)  # causal: mean attended length s/2
    return ETA_TRAIN * F_BF16 * t / (s * per_position * f_kappa)


def kv_batch_limit(t, m=STUDENT):
    return int((HBM_USABLE * HBM - 2 * m.n) // ((P + t) * m.kv_bytes()))


def decode_rate(t, batch, t_ovh, m=STUDENT):
    """Response tokens/s one GPU samples with `batch` sequences in flight (bf16 weights and KV)."""
    ctx = P + t / 2                                   # mean context over the response
    step_bytes = 2 * m.n + batch * ctx * m.kv_bytes()
    step_flops = batch * (2 * m.n + m.attn_flops(ctx))
    step = max(step_bytes / (ETA_DECODE_BW * HBM_BW), step_flops / (ETA_DECODE_F * F_BF16)) + t_ovh
    prefill_per_token = P * 2 * m.n / (t * ETA_PREFILL * F_BF16)  # each sequence prefills its prompt
    return 1.0 / (step / batch + prefill_per_token)


def engine_batch(t):
    return min(B_ENGINE_CAP, kv_batch_limit(t))


def worker_batch(g, t):
    return min(WORKER_ITEMS * g, kv_batch_limit(t))


def teacher_rate(t, m=TEACHER):
    """Response tokens/s one teacher GPU scores: one forward over prompt+response (compute),
    capped by the scorer's copy of the full [rows, V] fp32 log-probs to the host."""
    s = P + t
    compute = ETA_PREFILL * F_BF16 * t / (s * (2 * m.n + m.attn_flops(s / 2)))
    d2h = PCIE / (4 * m.vocab)
    return min(compute, d2h)


def teacher_batch_limit(t, logit_bytes, m=TEACHER):
    """teacher.max_batch_sequences that fits the [B, P+T, V] logits the scorer materialises."""
    return int((HBM_USABLE * HBM - 2 * m.n) // ((P + t) * m.vocab * logit_bytes))


def fmt(x, digits=2):
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}f}"


def kilo(x):
    return f"{x / 1e3:.1f}k"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def stage_rates():
    rows = []
    for t in TS:
        b = engine_batch(t)
        rows.append([t, kilo(learner_rate(t, 1.0)), kilo(learner_rate(t, KAPPA_EVERY_4)),
                     kilo(learner_rate(t, KAPPA_EVERY_STEP)),
                     f"{kilo(decode_rate(t, b, T_OVH_ENGINE))} (B={b})",
                     " / ".join(kilo(decode_rate(t, worker_batch(g, t), T_OVH_EAGER)) for g in GS),
                     kilo(teacher_rate(t))])
    return table(["T", "learner, plain", "learner, κ every 4th", "learner, κ every step",
                  "generation, batched engine",
                  f"generation, kappa worker B={WORKER_ITEMS}·G (G = 4 / 8 / 16)",
                  "teacher Score"], rows)


def answer_table(f_kappa):
    rows = []
    for g in GS:
        for t in TS:
            learn = learner_rate(t, f_kappa)
            gen_engine = learn / decode_rate(t, engine_batch(t), T_OVH_ENGINE)
            gen_as_is = learn / decode_rate(t, worker_batch(g, t), T_OVH_EAGER)
            teach = learn / teacher_rate(t)
            step_s = SAMPLES_PER_STEP * t / learn
            rows.append([g, t, kilo(learn), fmt(gen_engine), fmt(gen_as_is), fmt(teach),
                         fmt(learn / t, 1), fmt(step_s, 1)])
    return table(["G", "T", "learner tok/s (1 GPU)", "generation GPUs (engine)",
                  f"generation GPUs (kappa worker, B={WORKER_ITEMS}·G)", "teacher GPUs", "rewards/s",
                  "step s (512 samples)"], rows)


def decode_detail():
    rows = []
    m = STUDENT
    for t in TS:
        b = engine_batch(t)
        ctx = P + t / 2
        w = 2 * m.n
        kv = b * ctx * m.kv_bytes()
        mem_ms = (w + kv) / (ETA_DECODE_BW * HBM_BW) * 1e3
        flop_ms = b * (2 * m.n + m.attn_flops(ctx)) / (ETA_DECODE_F * F_BF16) * 1e3
        rows.append([t, kv_batch_limit(t), b, f"{w / 1e9:.2f}", f"{kv / 1e9:.1f}",
                     f"{mem_ms:.2f}", f"{flop_ms:.2f}", "memory" if mem_ms > flop_ms else "compute"])
    return table(["T", "B that fits the KV cache", "B used", "weights GB/step", "KV GB/step",
                  "ms (bandwidth)", "ms (FLOPs)", "bound"], rows)


def payload_table(f_kappa):
    rows = []
    for form, dtype, per_token in PAYLOAD:
        cells = [form, dtype, fmt(per_token, 1)]
        for t in TS:
            bps = learner_rate(t, f_kappa) * (per_token + SAMPLE_OVERHEAD)
            cells.append(f"{bps / 1e9:.2f} GB/s" if bps >= 1e8 else f"{bps / 1e6:.2f} MB/s")
        group = 16 * TS[-1] * per_token
        cells.append("yes" if group > MAX_MESSAGE else "no")
        rows.append(cells)
    return table(["form", "dtype", "B/token (bench)"] + [f"learner ingress, T={t}" for t in TS]
                 + ["G=16, T=8192 group > 64 MiB?"], rows)


def teacher_memory_table():
    rows = [[t, teacher_batch_limit(t, 2), teacher_batch_limit(t, 4)] for t in TS]
    return table(["T", "max_batch_sequences, bf16 logits", "fp32 logits"], rows)


def broadcast_table():
    version = 4 * STUDENT.n  # PublishPolicy: float32 copies of every parameter
    links = [("gRPC, loopback, 2-core CPU (measured)", GRPC_GBPS),
             ("raw TCP, loopback (measured)", TCP_GBPS),
             ("25 Gb/s Ethernet (line rate)", 25e9 / 8), ("100 Gb/s Ethernet (line rate)", 100e9 / 8),
             ("400 Gb/s InfiniBand (line rate)", 400e9 / 8)]
    rows = [[name, f"{rate / 1e9:.2f}", f"{version / rate:.2f}", f"{version / rate / 2:.2f}"]
            for name, rate in links]
    return table(["link", "GB/s", "s per worker per version (fp32, 4·N, as published)",
                  "s if published in bf16 (2·N)"], rows)


def allreduce_table(f_kappa):
    rows = []
    for r in (2, 8):
        for name, bus in (("NVLink, one node (NCCL ~400 GB/s bus)", 400e9),
                          ("400 Gb/s IB across nodes (~45 GB/s)", 45e9)):
            for nbuf, what in ((1, "one summed gradient"), (2, "∇L_R and ∇L_D (κ)")):
                moved = 2 * (r - 1) / r * nbuf * 4 * STUDENT.n
                t_ar = moved / bus
                t = 2048
                step = SAMPLES_PER_STEP * t / (r * learner_rate(t, f_kappa))
                rows.append([r, name, what, f"{t_ar:.2f}", f"{step:.1f}",
                             f"{100 * t_ar / (step + t_ar):.1f} %"])
    return table(["R", "link", "buffers", "all-reduce s", "compute s/step (T=2048, 512 samples)",
                  "share of step"], rows)


def data_parallel_table(f_kappa):
    rows = []
    version = 4 * STUDENT.n
    for t in TS:
        for r in (1, 2, 8):
            learn = r * learner_rate(t, f_kappa)
            gen = learn / decode_rate(t, engine_batch(t), T_OVH_ENGINE)
            teach = learn / teacher_rate(t)
            per_rank = max(1, math.ceil(gen / r))  # a worker streams to one rank; each rank needs one
            workers = per_rank * r
            egress = per_rank * version  # copies per version each rank sends
            step = SAMPLES_PER_STEP * t / learn
            rows.append([t, r, kilo(learn), fmt(gen), fmt(teach), workers,
                         f"{egress / 1e9:.1f}", fmt(step, 1)])
    return table(["T", "R", "learner tok/s", "generation GPUs (engine)", "teacher GPUs",
                  "workers (≥ 1 per rank)", "GB sent per version per rank", "step s (512 samples)"], rows)


def learner_memory_table():
    """Sequences one learner GPU can hold in one forward/backward as the code is written: fp32
    weights and activations, attention that materialises [heads, S, S], no activation
    checkpointing. trainer.micro_batch_sequences bounds a forward/backward, not the step."""
    m = STUDENT
    heads = m.d_attn // m.head_dim
    fixed = 20 * m.n  # fp32 weights 4N + two flat gradient buffers 8N + AdamW m, v 8N
    rows = []
    for t in TS:
        s = P + t
        act = m.layers * s * m.d_attn * 68          # 34*s*h bytes per layer at 16 bit, x2 for fp32
        attn = m.layers * 8 * heads * s * s         # scores + probs, fp32
        logits = 4 * s * m.vocab * 4                # student logits, log-softmax, grads; teacher rows
        per_seq = act + attn + logits
        fit = int((HBM_USABLE * HBM - fixed) // per_seq)
        rows.append([t, f"{act / 1e9:.1f}", f"{attn / 1e9:.1f}", f"{logits / 1e9:.1f}",
                     f"{per_seq / 1e9:.1f}", fit])
    return table(["T", "activations GB/seq", "attention scores GB/seq", "logits GB/seq",
                  "total GB/seq", "sequences per step per GPU"], rows)


def tables():
    return {
        "stage rates": stage_rates(),
        "decode detail": decode_detail(),
        "answer, kappa every 4": answer_table(KAPPA_EVERY_4),
        "answer, kappa every step": answer_table(KAPPA_EVERY_STEP),
        "data parallel": data_parallel_table(KAPPA_EVERY_4),
        "payload": payload_table(KAPPA_EVERY_4),
        "teacher memory": teacher_memory_table(),
        "broadcast": broadcast_table(),
        "allreduce": allreduce_table(KAPPA_EVERY_4),
        "learner memory": learner_memory_table(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", metavar="MD", help="fail unless every table appears in MD")
    args = parser.parse_args()
    all_tables = tables()
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            text = f.read()
        missing = [name for name, body in all_tables.items() if body not in text]
        for name in missing:
            print(f"{args.check}: table '{name}' is not what scaling_model.py computes; "
                  f"run it and paste:\n{all_tables[name]}\n", file=sys.stderr)
        if missing:
            return 1
        print(f"{args.check}: all {len(all_tables)} tables match")
        return 0
    for name, body in all_tables.items():
        print(f"<!-- scaling_model.py: {name} -->\n{body}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
