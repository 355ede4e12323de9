#!/usr/bin/python3
"""Self-check of the HF reference fixtures (make_checkpoints.py + hf_forward.py).

The reference is written from the HF modeling semantics (modeling_llama.py, modeling_qwen2.py,
modeling_qwen3.py, modeling_rope_utils.py); this script checks its internal consistency:
  (a) left-padded rows give the same logits at real positions as the same rows unpadded;
  (b) llama3 rope_scaling really changes inv_freq at these tiny dims (and linear divides by factor);
  (c) Qwen3 q_norm / k_norm weights are used (perturbing them changes the logits);
  (d) causality: extending a sequence leaves the logits of its prefix unchanged;
  (e) unsupported configs are refused with exit code 2 and a message naming the key;
  (f) on-disk layout: tied => no lm_head.weight, index total_size, 8-byte header alignment,
      bf16/fp16 decoding matches torch, generation is deterministic.

Usage: /usr/bin/python3 tests/model/reference/check_reference.py     (exit 0 = all passed)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_forward as hf  # noqa: E402
import make_checkpoints as mk  # noqa: E402

PY = sys.executable


def forward_cli(model_dir, ids, mask=None):
    req = {"input_ids": ids} if mask is None else {"input_ids": ids, "attention_mask": mask}
    r = subprocess.run([PY, os.path.join(HERE, "hf_forward.py"), model_dir], input=json.dumps(req),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return torch.tensor(json.loads(r.stdout)["logits"], dtype=torch.float64)


def header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return n, json.loads(f.read(n))


def check_padding(d, vocab):
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in (7, 5, 2)]
    T = max(map(len, rows))
    ids = [[0] * (T - len(r)) + r for r in rows]
    mask = [[0] * (T - len(r)) + [1] * len(r) for r in rows]
    batch = forward_cli(d, ids, mask)
    worst = 0.0
    for b, r in enumerate(rows):
        alone = forward_cli(d, [r])[0]
        diff = (batch[b, T - len(r):] - alone).abs().max().item()
        worst = max(worst, diff)
        assert torch.allclose(batch[b, T - len(r):], alone, rtol=1e-5, atol=1e-6), (d, b, diff)
    # (d) causality: logits of the 5-token prefix are unchanged by the 2 extra tokens.
    full = forward_cli(d, [rows[0]])[0]
    pre = forward_cli(d, [rows[0][:5]])[0]
    assert torch.allclose(full[:5], pre, rtol=1e-5, atol=1e-6), d
    return worst


def check_rope(root):
    p = hf.resolve(hf.load_config(os.path.join(root, "llama_gqa_llama3rope_bf16")))
    scaled = hf.rope_inv_freq(p)
    plain = hf.rope_inv_freq(dict(p, rope_type="default", rope_scaling=None))
    changed = (scaled != plain)
    assert changed.any(), "llama3 scaling did not change any frequency"
    ratio = (plain / scaled).tolist()
    print(f"  (b) llama3 inv_freq: {changed.sum().item()}/{len(ratio)} changed; "
          f"plain/scaled = {[round(x, 4) for x in ratio]}")
    assert all(1.0 <= x <= 8.0 + 1e-5 for x in ratio)
    p = hf.resolve(hf.load_config(os.path.join(root, "llama_linear_rope_bias")))
    lin = hf.rope_inv_freq(p)
    base = hf.rope_inv_freq(dict(p, rope_type="default", rope_scaling=None))
    assert torch.equal(lin, base / 2.0), "linear scaling must divide inv_freq by factor"


def check_qk_norm(root, tmp):
    src = os.path.join(root, "qwen3_qknorm_headdim")
    dst = os.path.join(tmp, "qwen3_perturbed")
    shutil.copytree(src, dst)
    ids = [[3, 17, 42, 99, 5, 64]]
    base = forward_cli(dst, ids)
    with open(os.path.join(dst, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    for name in ("model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"):
        path = os.path.join(dst, wm[name])
        n, h = header(path)
        b, e = h[name]["data_offsets"]
        assert h[name]["dtype"] == "BF16" and h[name]["shape"] == [24]
        with open(path, "r+b") as f:  # patch in place: weight := 2.0 (bf16 0x4000)
            f.seek(8 + n + b)
            f.write(np.full((e - b) // 2, 0x4000, dtype="<u2").tobytes())
        moved = (forward_cli(dst, ids) - base).abs().max().item()
        print(f"  (c) {name} := 2.0 changes logits by up to {moved:.3e}")
        assert moved > 1e-4, name
        base = forward_cli(dst, ids)


def check_refusals(root, tmp):
    cases = {"rope_scaling": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
             "use_sliding_window": {"use_sliding_window": True},
             "hidden_act": {"hidden_act": "gelu"}}
    for key, patch in cases.items():
        d = os.path.join(tmp, "refuse_" + key)
        shutil.copytree(os.path.join(root, "qwen2_tied_bf16"), d)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        cfg.update(patch)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        r = subprocess.run([PY, os.path.join(HERE, "hf_forward.py"), d], input='{"input_ids": [[1]]}',
                           capture_output=True, text=True)
        assert r.returncode == 2 and key in r.stderr, (key, r.returncode, r.stderr)
    print(f"  (e) refused with exit 2: {sorted(cases)}")


def check_layout(root, tmp):
    for name, (cfg, dtype, shards) in mk.VARIANTS.items():
        d = os.path.join(root, name)
        files = sorted(x for x in os.listdir(d) if x.endswith(".safetensors"))
        assert len(files) == shards, (name, files)
        names, total = {}, 0
        for fn in files:
            n, h = header(os.path.join(d, fn))
            assert n % 8 == 0 and h["__metadata__"] == {"format": "pt"}
            size = os.path.getsize(os.path.join(d, fn)) - 8 - n
            ends = sorted(v["data_offsets"] for k, v in h.items() if k != "__metadata__")
            assert ends[0][0] == 0 and ends[-1][1] == size
            assert all(a[1] == b[0] for a, b in zip(ends, ends[1:])), "gap/overlap in data"
            assert {v["dtype"] for k, v in h.items() if k != "__metadata__"} == {mk.DTYPE[dtype][0]}
            names.update({k: fn for k in h if k != "__metadata__"})
            total += size
        if shards > 1:
            with open(os.path.join(d, "model.safetensors.index.json")) as f:
                idx = json.load(f)
            assert idx["weight_map"] == names and idx["metadata"]["total_size"] == total
        assert ("lm_head.weight" in names) == (not cfg["tie_word_embeddings"]), name
        p = hf.resolve(hf.load_config(d))
        assert sorted(names) == sorted(hf.expected_tensor_names(p)), name
        for fn in ("config.json", "generation_config.json", "tokenizer_config.json"):
            with open(os.path.join(d, fn)) as f:
                json.load(f)
    # bf16 decoding by hand == torch's bf16 -> fp32
    path = os.path.join(root, "qwen2_tied_bf16", "model.safetensors")
    n, h = header(path)
    b, e = h["model.norm.weight"]["data_offsets"]
    with open(path, "rb") as f:
        f.seek(8 + n + b)
        raw = np.frombuffer(f.read(e - b), dtype="<i2").copy()
    ref = torch.from_numpy(raw).view(torch.bfloat16).float()
    assert torch.equal(hf.load_weights(os.path.dirname(path))["model.norm.weight"], ref)
    # deterministic regeneration
    again = os.path.join(tmp, "again")
    subprocess.run([PY, os.path.join(HERE, "make_checkpoints.py"), again, "--only", "qwen3_qknorm_headdim"],
                   check=True, capture_output=True)
    for fn in os.listdir(os.path.join(root, "qwen3_qknorm_headdim")):
        with open(os.path.join(root, "qwen3_qknorm_headdim", fn), "rb") as x, \
                open(os.path.join(again, "qwen3_qknorm_headdim", fn), "rb") as y:
            assert x.read() == y.read(), fn
    print("  (f) layout: shards/index/alignment/tied/names OK, bf16 decode == torch, regeneration identical")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "ckpt")
        out = subprocess.run([PY, os.path.join(HERE, "make_checkpoints.py"), root],
                             check=True, capture_output=True, text=True).stdout
        print(out, end="")
        assert len(out.strip().splitlines()) == len(mk.VARIANTS)
        for name, (cfg, _, _) in mk.VARIANTS.items():
            worst = check_padding(os.path.join(root, name), cfg["vocab_size"])
            print(f"  (a,d) {name}: left-padded == unpadded (max |diff| {worst:.1e}), causal prefix OK")
        check_rope(root)
        check_qk_norm(root, tmp)
        check_refusals(root, tmp)
        check_layout(root, tmp)
    print("check_reference: ALL OK")


if __name__ == "__main__":
    main()
