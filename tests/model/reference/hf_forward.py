#!/usr/bin/python3
"""Reference forward pass for HF LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM.

Written from the Hugging Face transformers modeling semantics (never from kappa's C++):
  src/transformers/models/llama/modeling_llama.py   (LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half,
                                                     apply_rotary_pos_emb, repeat_kv, eager_attention_forward,
                                                     LlamaAttention, LlamaMLP, LlamaDecoderLayer)
  src/transformers/models/qwen2/modeling_qwen2.py   (Qwen2Attention: bias on q/k/v only)
  src/transformers/models/qwen3/modeling_qwen3.py   (Qwen3Attention: q_norm/k_norm per head)
  src/transformers/modeling_rope_utils.py           (_compute_default_rope_parameters,
                                                     _compute_linear_scaling_rope_parameters,
                                                     _compute_llama3_parameters)
  src/transformers/models/{llama,qwen2,qwen3}/configuration_*.py  (defaults for absent keys)
  src/transformers/generation/utils.py-style left padding: position_ids = cumsum(mask) - 1.

With --adapter DIR, a PEFT LoRA adapter directory is merged into the base weights first, written
from PEFT (never from kappa's C++):
  src/peft/tuners/lora/config.py       (LoraConfig fields and defaults: r=8, lora_alpha=8, use_rslora)
  src/peft/tuners/lora/layer.py        (LoraLayer.update_layer: scaling = lora_alpha / r, or
                                         lora_alpha / sqrt(r) with use_rslora; Linear.get_delta_weight:
                                         delta = (B @ A) * scaling, transposed only with fan_in_fan_out;
                                         Linear.merge: W += delta)
  src/peft/utils/save_and_load.py      (saved keys: "base_model.model." + module + ".lora_A.weight"/".lora_B.weight",
                                         no adapter name)
Merging equals the unmerged forward W x + scaling * B (A x) up to rounding (lora_dropout is off in eval).

Compute is float32 throughout (weights upcast on load), i.e. HF loaded with torch_dtype=torch.float32.
safetensors is read by hand (no `safetensors` / `transformers` / `peft` packages).

Usage:
  echo '{"input_ids": [[1,2,3]], "attention_mask": [[1,1,1]]}' | \
      /usr/bin/python3 tests/model/reference/hf_forward.py MODEL_DIR [--adapter ADAPTER_DIR] > logits.json
stdout: {"logits": [[[V floats] per position] per row]}.  Exit 2 on unsupported configs or adapters.
"""
import json
import math
import os
import sys

import numpy as np
import torch

SUPPORTED = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


class Unsupported(Exception):
    pass


# ---------------------------------------------------------------- config
def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def resolve(cfg):
    """Return a dict of the hyper-parameters actually used, applying HF's per-class defaults."""
    mt = cfg.get("model_type")
    if mt not in SUPPORTED:
        raise Unsupported(f"model_type={mt!r} (supported: {sorted(SUPPORTED)})")
    for arch in cfg.get("architectures") or []:
        if arch != SUPPORTED[mt]:
            raise Unsupported(f"architectures={arch!r} for model_type {mt!r}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise Unsupported(f"hidden_act={cfg.get('hidden_act')!r}")
    if cfg.get("use_sliding_window", False):
        raise Unsupported("use_sliding_window=true")
    # configuration_qwen2/qwen3.py: layer_types defaults to all "full_attention" when
    # use_sliding_window is false; an explicit sliding entry would enable SWA on that layer.
    if any(t != "full_attention" for t in (cfg.get("layer_types") or [])):
        raise Unsupported("layer_types contains a non-full_attention layer")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise Unsupported("partial_rotary_factor != 1")

    heads = cfg["num_attention_heads"]
    # num_key_value_heads: LlamaConfig default None -> heads; Qwen2Config/Qwen3Config default 32.
    kv = cfg.get("num_key_value_heads", heads if mt == "llama" else 32)
    kv = heads if kv is None else kv
    # head_dim: modeling_*.py uses getattr(config, "head_dim", hidden_size // num_attention_heads);
    # Qwen3Config has head_dim=128 as a *default* when the key is absent.
    if "head_dim" in cfg and cfg["head_dim"] is not None:
        head_dim = cfg["head_dim"]
    elif mt == "qwen3" and "head_dim" not in cfg:
        head_dim = 128
    else:
        head_dim = cfg["hidden_size"] // heads

    rs = cfg.get("rope_scaling")
    if rs is None:
        rope_type = "default"
    else:
        # Llama/Qwen*RotaryEmbedding.__init__: rope_scaling.get("rope_type", rope_scaling.get("type"))
        rope_type = rs.get("rope_type", rs.get("type"))
        if rope_type not in ("default", "linear", "llama3"):
            raise Unsupported(f"rope_scaling.rope_type/type={rope_type!r}")

    if mt == "qwen2":
        # Qwen2Attention: q/k/v_proj bias=True unconditionally, o_proj bias=False; MLP has no bias.
        qkv_bias, o_bias, mlp_bias = True, False, False
    elif mt == "qwen3":
        # Qwen3Attention: bias=config.attention_bias on q/k/v/o; Qwen3MLP bias=False.
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
        mlp_bias = False
    else:
        # LlamaAttention: bias=config.attention_bias on q/k/v/o; LlamaMLP: bias=config.mlp_bias.
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
        mlp_bias = bool(cfg.get("mlp_bias", False))

    return dict(
        model_type=mt, vocab=cfg["vocab_size"], hidden=cfg["hidden_size"],
        inter=cfg["intermediate_size"], layers=cfg["num_hidden_layers"], heads=heads, kv_heads=kv,
        head_dim=head_dim, eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=cfg.get("rope_theta", 10000.0), rope_type=rope_type, rope_scaling=rs,
        # Llama/Qwen2/Qwen3 configs all pass tie_word_embeddings=False as their default.
        tied=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias, qk_norm=(mt == "qwen3"),
    )


# ---------------------------------------------------------------- safetensors (by hand)
def _read_safetensors(path, out):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[b:e]
        dt = info["dtype"]
        if dt == "F32":
            arr = raw.view("<f4").astype(np.float32)
        elif dt == "F16":
            arr = raw.view("<f2").astype(np.float32)
        elif dt == "BF16":  # bf16 = upper 16 bits of an f32: exact upcast
            arr = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise Unsupported(f"tensor dtype {dt!r} ({name})")
        out[name] = torch.from_numpy(arr.reshape(info["shape"]))


def load_weights(model_dir):
    w = {}
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        for s in shards:
            _read_safetensors(os.path.join(model_dir, s), w)
    else:
        _read_safetensors(os.path.join(model_dir, "model.safetensors"), w)
    return w


# ---------------------------------------------------------------- PEFT LoRA adapter (merged)
PEFT_PREFIX = "base_model.model."


def adapter_scaling(cfg):
    """LoraLayer.update_layer: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora (PEFT defaults 8, 8)."""
    if cfg.get("peft_type") != "LORA":
        raise Unsupported(f"adapter peft_type={cfg.get('peft_type')!r}")
    for key in ("use_dora", "fan_in_fan_out", "lora_bias"):
        if cfg.get(key):
            raise Unsupported(f"adapter {key}=true")
    for key in ("rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform"):
        if cfg.get(key):
            raise Unsupported(f"adapter {key}={cfg[key]!r}")
    r, alpha = cfg.get("r", 8), cfg.get("lora_alpha", 8)
    return alpha / math.sqrt(r) if cfg.get("use_rslora", False) else alpha / r


def merge_adapter(w, adapter_dir):
    """Linear.merge for every adapted module: W += (B @ A) * scaling, in float32."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    scaling = adapter_scaling(cfg)
    targets = cfg["target_modules"]
    if isinstance(targets, str):
        raise Unsupported(f"adapter target_modules as a regex {targets!r}")
    tensors = {}
    _read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"), tensors)
    merged = 0
    for key in sorted(tensors):
        if not (key.startswith(PEFT_PREFIX) and key.endswith(".lora_A.weight")):
            if not (key.startswith(PEFT_PREFIX) and key.endswith(".lora_B.weight")):
                raise Unsupported(f"adapter tensor {key!r}")
            continue
        module = key[len(PEFT_PREFIX):-len(".lora_A.weight")]
        if module.rsplit(".", 1)[-1] not in targets:
            raise Unsupported(f"adapter tensor {key!r} outside target_modules {targets}")
        a = tensors[key]                                                    # [r, in]
        b = tensors[PEFT_PREFIX + module + ".lora_B.weight"]                # [out, r]
        base = w[module + ".weight"]                                        # [out, in]
        if a.shape[0] != cfg.get("r", 8) or b.shape[1] != a.shape[0] or (b.shape[0], a.shape[1]) != base.shape:
            raise SystemExit(f"hf_forward: adapter {module}: A {list(a.shape)}, B {list(b.shape)} do not fit "
                             f"the base {list(base.shape)} with r={cfg.get('r', 8)}")
        w[module + ".weight"] = base + (b @ a) * scaling
        merged += 1
    # PEFT adapts every module whose name ends in a target (check_target_module_exists).
    targeted = [n for n in w if n.endswith(".weight") and n[:-len(".weight")].rsplit(".", 1)[-1] in targets]
    if merged != len(targeted):
        raise SystemExit(f"hf_forward: {adapter_dir} adapts {merged} modules, target_modules name {len(targeted)}")
    return merged


# ---------------------------------------------------------------- RoPE (modeling_rope_utils.py)
def rope_inv_freq(p):
    dim, base = p["head_dim"], p["rope_theta"]
    # _compute_default_rope_parameters: computed in float32 exactly like this.
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = p["rope_scaling"]
    if p["rope_type"] == "linear":
        # _compute_linear_scaling_rope_parameters: inv_freq /= factor (scaling applied to frequencies).
        inv_freq = inv_freq / rs["factor"]
    elif p["rope_type"] == "llama3":
        # _compute_llama3_parameters
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_ctx = rs["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old_ctx / lo, old_ctx / hi
        wavelen = 2 * math.pi / inv_freq
        inv_l = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        inv_freq = torch.where(is_medium, smoothed, inv_l)
    return inv_freq  # attention_scaling is 1.0 for default/linear/llama3


def rotate_half(x):  # modeling_llama.py rotate_half: halves layout (NOT interleaved pairs)
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


# ---------------------------------------------------------------- model
def rms_norm(x, w, eps):
    # LlamaRMSNorm.forward: fp32 variance, x * rsqrt(var + eps), cast back to input dtype, then * weight.
    dt = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(dt)


def linear(x, w, b=None):
    return torch.nn.functional.linear(x, w, b)


def repeat_kv(x, n_rep):
    # modeling_llama.py repeat_kv: kv head j serves query heads j*n_rep .. j*n_rep+n_rep-1
    # (== repeat_interleave on the head dim).
    b, h, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def forward(p, w, input_ids, attention_mask):
    """input_ids, attention_mask: LongTensor [B, T]. Returns float32 logits [B, T, V]."""
    B, T = input_ids.shape
    H, KV, D = p["heads"], p["kv_heads"], p["head_dim"]
    mask = attention_mask.to(torch.long)
    # GenerationMixin left-padding convention: position_ids = cumsum(mask) - 1 (pads clamped to 0 here;
    # HF fills them with 1 -- irrelevant, pad positions are never attended to and their output is ignored).
    pos = (mask.cumsum(-1) - 1).clamp(min=0)

    # LlamaRotaryEmbedding.forward: freqs = inv_freq @ position_ids in float32, emb = cat(freqs, freqs).
    inv_freq = rope_inv_freq(p)
    freqs = (inv_freq[None, :, None].expand(B, -1, 1) @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # [B, 1, T, D] (unsqueeze_dim=1)

    # Causal mask combined with key padding; additive finfo.min like HF's 4D mask (no NaN on empty rows).
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    allowed = causal[None] & mask.bool()[:, None, :]
    add_mask = torch.zeros(B, 1, T, T).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)

    x = w["model.embed_tokens.weight"][input_ids]
    for i in range(p["layers"]):
        pre = f"model.layers.{i}."
        a = pre + "self_attn."
        h = rms_norm(x, w[pre + "input_layernorm.weight"], p["eps"])
        q = linear(h, w[a + "q_proj.weight"], w[a + "q_proj.bias"] if p["qkv_bias"] else None)
        k = linear(h, w[a + "k_proj.weight"], w[a + "k_proj.bias"] if p["qkv_bias"] else None)
        v = linear(h, w[a + "v_proj.weight"], w[a + "v_proj.bias"] if p["qkv_bias"] else None)
        q, k, v = q.view(B, T, H, D), k.view(B, T, KV, D), v.view(B, T, KV, D)
        if p["qk_norm"]:
            # Qwen3Attention.forward: q_norm/k_norm are RMSNorm over head_dim, per head,
            # applied after the projection reshape and BEFORE RoPE.
            q = rms_norm(q, w[a + "q_norm.weight"], p["eps"])
            k = rms_norm(k, w[a + "k_norm.weight"], p["eps"])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, D]
        # apply_rotary_pos_emb: q*cos + rotate_half(q)*sin
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # eager_attention_forward: repeat_kv, scores * head_dim**-0.5 (+mask), softmax in fp32.
        k, v = repeat_kv(k, H // KV), repeat_kv(v, H // KV)
        scores = torch.matmul(q, k.transpose(2, 3)) * (D ** -0.5) + add_mask
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        o = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, H * D)
        x = x + linear(o, w[a + "o_proj.weight"], w[a + "o_proj.bias"] if p["o_bias"] else None)
        # LlamaDecoderLayer: post_attention_layernorm -> MLP down(silu(gate(x)) * up(x)) -> residual.
        h = rms_norm(x, w[pre + "post_attention_layernorm.weight"], p["eps"])
        m = pre + "mlp."
        bias = (lambda n: w[m + n + ".bias"]) if p["mlp_bias"] else (lambda n: None)
        gate = linear(h, w[m + "gate_proj.weight"], bias("gate_proj"))
        up = linear(h, w[m + "up_proj.weight"], bias("up_proj"))
        x = x + linear(torch.nn.functional.silu(gate) * up, w[m + "down_proj.weight"], bias("down_proj"))
    x = rms_norm(x, w["model.norm.weight"], p["eps"])
    # tie_word_embeddings: lm_head.weight is absent on disk and shares model.embed_tokens.weight.
    head = w["model.embed_tokens.weight"] if p["tied"] else w["lm_head.weight"]
    return linear(x, head)


def expected_tensor_names(p):
    names = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if p["tied"] else ["lm_head.weight"])
    for i in range(p["layers"]):
        pre = f"model.layers.{i}."
        names += [pre + "input_layernorm.weight", pre + "post_attention_layernorm.weight"]
        for proj in "qkvo":
            names.append(pre + f"self_attn.{proj}_proj.weight")
            if (p["o_bias"] if proj == "o" else p["qkv_bias"]):
                names.append(pre + f"self_attn.{proj}_proj.bias")
        if p["qk_norm"]:
            names += [pre + "self_attn.q_norm.weight", pre + "self_attn.k_norm.weight"]
        for proj in ("gate", "up", "down"):
            names.append(pre + f"mlp.{proj}_proj.weight")
            if p["mlp_bias"]:
                names.append(pre + f"mlp.{proj}_proj.bias")
    return names


def run(model_dir, request, adapter_dir=None):
    p = resolve(load_config(model_dir))
    w = load_weights(model_dir)
    if adapter_dir is not None:
        merge_adapter(w, adapter_dir)
    need = expected_tensor_names(p)
    missing = [n for n in need if n not in w]
    if missing:
        raise SystemExit(f"hf_forward: missing tensors: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    extra = sorted(set(w) - set(need))
    if extra:  # HF ignores unexpected keys (with a warning); do the same.
        print(f"hf_forward: warning: unused tensors: {extra[:5]}", file=sys.stderr)
    ids = torch.tensor(request["input_ids"], dtype=torch.long)
    am = request.get("attention_mask")
    am = torch.ones_like(ids) if am is None else torch.tensor(am, dtype=torch.long)
    if ids.dim() != 2 or am.shape != ids.shape:
        raise SystemExit("hf_forward: input_ids must be [B][T] and attention_mask the same shape")
    if ids.numel() and (ids.min() < 0 or ids.max() >= p["vocab"]):
        raise SystemExit("hf_forward: token id out of range")
    with torch.no_grad():
        return forward(p, w, ids, am)


def main(argv):
    adapter_dir = None
    if len(argv) == 4 and argv[2] == "--adapter":
        adapter_dir = argv[3]
    elif len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 1
    try:
        logits = run(argv[1], json.load(sys.stdin), adapter_dir)
    except Unsupported as e:
        print(f"hf_forward: unsupported config: {e}", file=sys.stderr)
        return 2
    json.dump({"logits": logits.double().tolist()}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
