#!/usr/bin/env python3
"""Random Qwen2-architecture Hugging Face checkpoints with the real Qwen2.5 tokenizer, for
bench/gpu/run.sh's whole-system run: the student and the teacher of `kappa run`.

The tensors, their names and config.json are tests/model/reference/make_checkpoints.py's (its
tensor_specs, config_json and safetensors header); the tokenizer files are the real Qwen2.5 ones
(tokenizer.json and tokenizer_config.json with its ChatML template), as
tests/integration/qwen_gsm8k_run_test.cc's WriteTinyQwen does, so prompts render and tokenize as
for Qwen2.5-Instruct and <|im_end|> (151645) is the stop id. The weights are normal(0, 0.02)
(q/k 0.25, norms 1 + 0.1 N), drawn with torch (on CUDA when --device cuda: seconds at 1.5B);
with random weights a response runs to its token budget, never stops and never answers.

--guesser makes each model guess small numbers, as tests/integration/qwen_gsm8k_run_test.cc's
MakeGuesser does for its tiny models (the same ids, features and constants, written from that
description): after "\n" or " " it says one of 3, 4, 5, 6, after a guess " " or <|im_end|>. A
response then stops within a few tokens and its last number is right with probability 1/4 on
GSM8K-layout data whose answers are 3 to 6 (tests/integration/fixtures/gsm8k_tiny_*.jsonl), so
groups get reward variance and the RL gradient, kappa and K_DR are not zero. Only the embedding,
layer 0's MLP and o_proj and the final norm are edited; the other layers stay random.

  write_qwen_checkpoints.py OUT_DIR --tokenizer DIR [--shapes student=qwen2.5-0.5b,teacher=qwen2.5-1.5b]
                            [--guesser]
prints one line per checkpoint: name, parameters, bytes, seconds.
"""
import argparse
import ctypes
import gzip
import json
import math
import os
import shutil
import sys
import time
import types

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "model", "reference"))
try:
    import numpy  # noqa: F401  (make_checkpoints imports it; only np.prod is used below)
except ImportError:  # a GPU image without numpy: make_checkpoints needs only np.prod here
    sys.modules["numpy"] = types.SimpleNamespace(prod=lambda s: math.prod(s))
import make_checkpoints as mc  # noqa: E402

IM_END, ENDOFTEXT = 151645, 151643


def qwen(hidden, layers, heads, kv_heads, ffn, vocab=151936):
    return mc._qwen("qwen2", vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                    num_hidden_layers=layers, num_attention_heads=heads,
                    num_key_value_heads=kv_heads, max_position_embeddings=32768,
                    sliding_window=32768, max_window_layers=layers, tie_word_embeddings=True,
                    bos_token_id=ENDOFTEXT, eos_token_id=IM_END)


SHAPES = {
    # Qwen2.5-0.5B and -1.5B: real widths, depths, heads and vocabulary, tied.
    "qwen2.5-0.5b": qwen(896, 24, 14, 2, 4864),
    "qwen2.5-1.5b": qwen(1536, 28, 12, 2, 8960),
    # The CPU rehearsal's: the real vocabulary, tiny bodies.
    "tiny-student": qwen(64, 2, 4, 2, 128),
    "tiny-teacher": qwen(96, 2, 4, 2, 192),
}
STD = {"mat": 0.02, "qk": 0.25, "norm": 0.1}

NEWLINE, SPACE, GUESSES = 198, 220, (18, 19, 20, 21)  # "\n", " ", "3" "4" "5" "6"
GUESSER_TENSORS = ("model.embed_tokens.weight", "model.layers.0.self_attn.o_proj.weight",
                   "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                   "model.layers.0.mlp.down_proj.weight", "model.norm.weight")


def make_guesser_one(name, t):
    """Edits `t` (float32, whole), the tensor `name` of GUESSER_TENSORS, in place.

    Hidden dimensions A, B, C carry three features: A ("\n"), B (a guess), C (" ", <|im_end|>).
    Layer 0's MLP maps A and C to B and B to C with size 15; the attention writes nothing; the
    final norm drops A. Tied embeddings: the feature rows are the output rows too, so the four
    guesses (then " " and <|im_end|>) have even odds and random rows almost none. Each tensor's
    edit needs only that tensor, so they are made as the file is written.
    """
    a, b, c = 0, 1, 2
    feature, mapped = 5.0, 15.0
    if name == "model.embed_tokens.weight":
        for token, dim in [(NEWLINE, a)] + [(g, b) for g in GUESSES] + [(SPACE, c), (IM_END, c)]:
            t[token].zero_()
            t[token][dim] = feature
    elif name == "model.layers.0.self_attn.o_proj.weight":
        t.zero_()
    elif name in ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"):
        t[:2].zero_()
        t[0][a] = t[0][c] = t[1][b] = 1.0
    elif name == "model.layers.0.mlp.down_proj.weight":
        # After the RMSNorm a feature is sqrt(d) on its dimension: a firing neuron gives
        # silu(sqrt d) * sqrt d.
        root_d = math.sqrt(t.shape[0])
        fired = root_d / (1.0 + math.exp(-root_d)) * root_d
        t[:, :2].zero_()
        t[b][0] = mapped / fired
        t[c][1] = mapped / fired
    elif name == "model.norm.weight":
        t[a] = 0.0


def random_chunks(shape, kind, gen, device, chunk=1 << 24):
    n = math.prod(shape)
    for start in range(0, n, chunk):
        x = torch.randn(min(chunk, n - start), generator=gen, device=device) * STD[kind]
        if kind == "norm":
            x += 1.0
        yield x


def write_bf16(f, x):
    b = x.to(torch.bfloat16).cpu().contiguous()
    f.write(ctypes.string_at(b.data_ptr(), b.numel() * 2))


def write(out, config, device, seed, guesser=False):
    os.makedirs(out, exist_ok=True)
    specs = mc.tensor_specs(config)
    head, total = mc._header(specs, "bfloat16")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    edited = {name: None for name, _, _ in specs if guesser and name in GUESSER_TENSORS}
    if guesser and len(edited) != len(GUESSER_TENSORS):
        raise SystemExit("--guesser: the shape lacks " + ", ".join(
            sorted(set(GUESSER_TENSORS) - set(edited))))
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(head)
        for name, shape, kind in specs:
            if name not in edited:
                for x in random_chunks(shape, kind, gen, device):
                    write_bf16(f, x)
                continue
            whole = torch.cat(list(random_chunks(shape, kind, gen, device))).view(shape).float()
            make_guesser_one(name, whole)
            write_bf16(f, whole)
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(mc.config_json(config, "bfloat16"))
    gen_config = {"bos_token_id": ENDOFTEXT, "eos_token_id": [IM_END, ENDOFTEXT],
                  "pad_token_id": ENDOFTEXT, "do_sample": True, "temperature": 0.7, "top_p": 0.8,
                  "top_k": 20, "repetition_penalty": 1.05,
                  "transformers_version": mc.TRANSFORMERS_VERSION}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        f.write(json.dumps(gen_config, indent=2, sort_keys=True) + "\n")
    return sum(math.prod(s) for _, s, _ in specs), total


def copy_tokenizer(src, out):
    shutil.copy(os.path.join(src, "tokenizer_config.json"), out)
    plain = os.path.join(src, "tokenizer.json")
    if os.path.exists(plain):
        shutil.copy(plain, out)
    else:  # .gpu_deps ships it compressed
        with gzip.open(plain + ".gz", "rb") as i, open(os.path.join(out, "tokenizer.json"), "wb") as o:
            shutil.copyfileobj(i, o)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--tokenizer", required=True,
                    help="directory of tokenizer_config.json and tokenizer.json (or tokenizer.json.gz)")
    ap.add_argument("--shapes", default="student=qwen2.5-0.5b,teacher=qwen2.5-1.5b",
                    help="NAME=SHAPE,... of " + ", ".join(SHAPES))
    ap.add_argument("--guesser", action="store_true",
                    help="make the models guess 3, 4, 5 or 6 and stop (see above)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    for k, item in enumerate(a.shapes.split(",")):
        name, shape = item.split("=")
        out = os.path.join(a.out_dir, name)
        start = time.time()
        params, nbytes = write(out, SHAPES[shape], a.device, seed=1 + k, guesser=a.guesser)
        copy_tokenizer(a.tokenizer, out)
        print(f"{name}: {shape} random bf16{' guesser' if a.guesser else ''}, {params} parameters, {nbytes} bytes, "
              f"{time.time() - start:.1f} s -> {out}", flush=True)


if __name__ == "__main__":
    main()
