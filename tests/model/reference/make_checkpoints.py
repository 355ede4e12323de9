#!/usr/bin/python3
"""Write tiny, seeded, random Hugging Face checkpoints (exact HF on-disk layout) for kappa's tests.

Layout follows what transformers' save_pretrained writes: config.json (sorted keys, fields of
LlamaConfig / Qwen2Config / Qwen3Config from src/transformers/models/*/configuration_*.py),
generation_config.json, model.safetensors or model-0000K-of-0000N.safetensors +
model.safetensors.index.json, plus a dummy tokenizer_config.json.  Tensor names and shapes
follow modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py (see hf_forward.py).
Tied checkpoints omit lm_head.weight, as HF does.  safetensors is written by hand.

Weights: normal(0, 0.02) for matrices, embeddings and biases, except q_proj/k_proj weights at
normal(0, 0.25), so attention is peaked and a RoPE or q/k-norm mistake moves the logits well
beyond the parity tolerance (at 0.02 attention is nearly uniform and hides position errors);
1 + 0.1*normal for norm weights.
Deterministic: numpy PCG64 seeded from the variant name.

Usage:
  /usr/bin/python3 tests/model/reference/make_checkpoints.py OUT_DIR [--only NAME]
  /usr/bin/python3 tests/model/reference/make_checkpoints.py OUT_DIR --shape qwen2.5-0.5b
"""
import argparse
import json
import os
import zlib

import numpy as np
import torch

TRANSFORMERS_VERSION = "4.51.0"
ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
DTYPE = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "float16": ("F16", 2)}


def _llama(**kw):
    c = dict(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=64,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=None,
             hidden_act="silu", max_position_embeddings=64, initializer_range=0.02,
             rms_norm_eps=1e-5, use_cache=True, bos_token_id=1, eos_token_id=2, pretraining_tp=1,
             tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None,
             attention_bias=False, attention_dropout=0.0, mlp_bias=False)
    c.update(kw)
    if c["head_dim"] is None:  # LlamaConfig stores hidden_size // num_attention_heads
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    return c


def _qwen(mt, **kw):
    c = dict(model_type=mt, vocab_size=128, hidden_size=64, intermediate_size=160,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             hidden_act="silu", max_position_embeddings=64, initializer_range=0.02,
             rms_norm_eps=1e-6, use_cache=True, bos_token_id=None, eos_token_id=None,
             tie_word_embeddings=False, rope_theta=1000000.0, rope_scaling=None,
             use_sliding_window=False, sliding_window=4096, max_window_layers=1,
             attention_dropout=0.0)
    if mt == "qwen3":
        c.update(attention_bias=False, head_dim=c["hidden_size"] // c["num_attention_heads"])
    c.update(kw)
    # Like Qwen2.5 base configs: bos == eos == <|endoftext|> (here the last vocab id).
    for k in ("bos_token_id", "eos_token_id"):
        if c[k] is None:
            c[k] = c["vocab_size"] - 1
    return c


# name -> (config, torch_dtype on disk, number of shards)
VARIANTS = {
    "llama_tied_fp32": (_llama(tie_word_embeddings=True), "float32", 1),
    "llama_gqa_llama3rope_bf16": (_llama(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_key_value_heads=2,
        rope_theta=500000.0, bos_token_id=0, eos_token_id=1,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        "bfloat16", 1),
    # Old-style Llama-2-era key "type" (not "rope_type") on purpose.
    "llama_linear_rope_bias": (_llama(
        vocab_size=112, hidden_size=48, intermediate_size=96, attention_bias=True,
        rope_scaling={"type": "linear", "factor": 2.0}), "float16", 1),
    "qwen2_bias_sharded": (_qwen("qwen2"), "float32", 3),
    "qwen2_tied_bf16": (_qwen("qwen2", vocab_size=96, hidden_size=32, intermediate_size=80,
                              num_key_value_heads=1, tie_word_embeddings=True), "bfloat16", 1),
    "qwen3_qknorm_headdim": (_qwen("qwen3", intermediate_size=128, head_dim=24), "bfloat16", 2),
    "qwen3_tied_fp32": (_qwen("qwen3", vocab_size=96, hidden_size=32, intermediate_size=64,
                              tie_word_embeddings=True), "float32", 1),
    # Extra (not in the original list): Qwen3 with attention_bias=true -> q/k/v/o biases.
    "qwen3_attn_bias_fp16": (_qwen("qwen3", vocab_size=100, hidden_size=48, intermediate_size=96,
                                   num_attention_heads=6, num_key_value_heads=3, head_dim=8,
                                   attention_bias=True), "float16", 1),
}

SHAPES = {  # real Qwen2.5-0.5B dimensions, random weights
    "qwen2.5-0.5b": ("qwen2.5-0.5b-random", _qwen(
        "qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        sliding_window=32768, max_window_layers=24, tie_word_embeddings=True,
        bos_token_id=151643, eos_token_id=151643), "bfloat16", 1),
}


def tensor_specs(c):
    """[(name, shape, kind)] in module order; kind: 'mat' (std 0.02), 'qk' (std 0.25) or 'norm' (1 + 0.1 N)."""
    mt, hd = c["model_type"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    H, nq, nkv, I = c["hidden_size"], c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, c["intermediate_size"]
    qkv_bias = True if mt == "qwen2" else c.get("attention_bias", False)   # Qwen2Attention: q/k/v always
    o_bias = False if mt == "qwen2" else c.get("attention_bias", False)    # Qwen2Attention: o never
    mlp_bias = c.get("mlp_bias", False) if mt == "llama" else False
    s = [("model.embed_tokens.weight", (c["vocab_size"], H), "mat")]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s.append((p + "input_layernorm.weight", (H,), "norm"))
        for proj, out, inp, b in (("q", nq, H, qkv_bias), ("k", nkv, H, qkv_bias),
                                  ("v", nkv, H, qkv_bias), ("o", H, nq, o_bias)):
            s.append((p + f"self_attn.{proj}_proj.weight", (out, inp), "qk" if proj in "qk" else "mat"))
            if b:
                s.append((p + f"self_attn.{proj}_proj.bias", (out,), "mat"))
        if mt == "qwen3":
            s += [(p + "self_attn.q_norm.weight", (hd,), "norm"), (p + "self_attn.k_norm.weight", (hd,), "norm")]
        s.append((p + "post_attention_layernorm.weight", (H,), "norm"))
        for proj, out, inp in (("gate", I, H), ("up", I, H), ("down", H, I)):
            s.append((p + f"mlp.{proj}_proj.weight", (out, inp), "mat"))
            if mlp_bias:
                s.append((p + f"mlp.{proj}_proj.bias", (out,), "mat"))
    s.append(("model.norm.weight", (H,), "norm"))
    if not c["tie_word_embeddings"]:
        s.append(("lm_head.weight", (c["vocab_size"], H), "mat"))
    return s


def gen_chunks(rng, shape, kind, dtype, chunk=1 << 22):
    """Yield the tensor's on-disk bytes in chunks (rows at a time), plus the fp32 values if small."""
    n = int(np.prod(shape))
    for start in range(0, n, chunk):
        x = rng.standard_normal(min(chunk, n - start), dtype=np.float32)
        x = 1.0 + 0.1 * x if kind == "norm" else (0.25 if kind == "qk" else 0.02) * x
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        if dtype == "bfloat16":  # round-to-nearest-even via torch; raw bytes through an int16 view
            yield t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
        elif dtype == "float16":
            yield t.to(torch.float16).numpy().astype("<f2").tobytes()
        else:
            yield t.numpy().astype("<f4").tobytes()


def _header(entries, dtype):
    code, size = DTYPE[dtype]
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in entries:
        nbytes = int(np.prod(shape)) * size
        hdr[name] = {"dtype": code, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    raw = json.dumps(hdr, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # pad header to 8-byte alignment
    return len(raw).to_bytes(8, "little") + raw, off


def write_safetensors(path, entries, rng, dtype):
    """Stream tensors to `path`: header first (computed from shapes), then each tensor's bytes."""
    head, total = _header(entries, dtype)
    with open(path, "wb") as f:
        f.write(head)
        for _, shape, kind in entries:
            for b in gen_chunks(rng, shape, kind, dtype):
                f.write(b)
    return total


def split_shards(specs, n, size):
    """Contiguous split in module order, balanced by bytes (may split inside a layer, like HF)."""
    total = sum(int(np.prod(s)) * size for _, s, _ in specs)
    shards, cur, acc = [[] for _ in range(n)], 0, 0
    for e in specs:
        if cur < n - 1 and acc >= total * (cur + 1) / n:
            cur += 1
        shards[cur].append(e)
        acc += int(np.prod(e[1])) * size
    return [s for s in shards if s]


def config_json(c, dtype):
    d = {k: v for k, v in c.items()}
    d.update(architectures=[ARCH[c["model_type"]]], torch_dtype=dtype,
             transformers_version=TRANSFORMERS_VERSION)
    return json.dumps(d, indent=2, sort_keys=True) + "\n"


def companions(c, out):
    gen = {"_from_model_config": True, "bos_token_id": c["bos_token_id"],
           "eos_token_id": c["eos_token_id"], "transformers_version": TRANSFORMERS_VERSION}
    if c["model_type"] != "llama" and c["vocab_size"] < 1000:
        # Qwen2.5-Instruct style generation_config: eos is a LIST (<|im_end|>, <|endoftext|>),
        # explicit pad and sampling defaults.
        gen = {"bos_token_id": c["bos_token_id"], "eos_token_id": [c["vocab_size"] - 2, c["eos_token_id"]],
               "pad_token_id": c["eos_token_id"], "do_sample": True, "temperature": 0.7, "top_p": 0.8,
               "top_k": 20, "repetition_penalty": 1.05, "transformers_version": TRANSFORMERS_VERSION}
    elif c["model_type"] != "llama":  # Qwen2.5-0.5B (base) style
        gen = {"bos_token_id": c["bos_token_id"], "eos_token_id": c["eos_token_id"], "do_sample": False,
               "max_new_tokens": 2048, "transformers_version": TRANSFORMERS_VERSION}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        f.write(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    bos, eos = ("<s>", "</s>") if c["model_type"] == "llama" else ("<|endoftext|>", "<|endoftext|>")
    tok = {"add_bos_token": c["model_type"] == "llama", "add_eos_token": False,
           "bos_token": bos, "eos_token": eos, "pad_token": None,
           "clean_up_tokenization_spaces": False, "model_max_length": c["max_position_embeddings"],
           "tokenizer_class": "LlamaTokenizerFast" if c["model_type"] == "llama" else "Qwen2TokenizerFast",
           "added_tokens_decoder": {str(c["bos_token_id"]): {"content": bos, "special": True, "lstrip": False,
                                                             "rstrip": False, "normalized": False,
                                                             "single_word": False}}}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        f.write(json.dumps(tok, indent=2) + "\n")


def write_variant(root, name, c, dtype, n_shards):
    out = os.path.join(root, name)
    os.makedirs(out, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(zlib.crc32(name.encode())))
    specs = tensor_specs(c)
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(config_json(c, dtype))
    companions(c, out)
    if n_shards == 1:
        total = write_safetensors(os.path.join(out, "model.safetensors"), specs, rng, dtype)
        files = "model.safetensors"
    else:
        weight_map, total, shards = {}, 0, split_shards(specs, n_shards, DTYPE[dtype][1])
        for k, part in enumerate(shards, 1):
            fn = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            total += write_safetensors(os.path.join(out, fn), part, rng, dtype)
            weight_map.update({e[0]: fn for e in part})
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            f.write(json.dumps({"metadata": {"total_size": total},
                                "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
        files = f"{len(shards)} shards + index"
    print(f"{name}: {ARCH[c['model_type']]} {dtype} {files}, {len(specs)} tensors, "
          f"{total} bytes, tied={c['tie_word_embeddings']} -> {out}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--only", choices=sorted(VARIANTS), help="write just this tiny variant")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="write ONE big checkpoint of this real shape")
    a = ap.parse_args()
    if a.shape:
        name, c, dtype, n = SHAPES[a.shape]
        write_variant(a.out_dir, name, c, dtype, n)
        return
    for name, (c, dtype, n) in VARIANTS.items():
        if a.only in (None, name):
            write_variant(a.out_dir, name, c, dtype, n)


if __name__ == "__main__":
    main()
