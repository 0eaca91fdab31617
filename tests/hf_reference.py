#!/usr/bin/python3
"""Hugging Face directories against an independent reference: for GPT-2,
for the Llama family (grouped-query attention, RMSNorm, SwiGLU, RoPE, an
untied head) and for Mixtral and Qwen2-MoE (their MLPs Mixtures of Experts), this script takes the config.json loom writes
(for Qwen3 and Qwen3-MoE, heads of their own width with QK-norm, one it writes itself as the Hub's are), fills
model.safetensors with its own random weights (large enough that a wrong
layout, a transposed matrix or RoPE pairing adjacent dimensions instead of
halves moves the loss by far more than the bound), computes the loss of a
text window with PyTorch as transformers' GPT2LMHeadModel and
LlamaForCausalLM compute it (written here from their definitions:
Conv1D [in, out] weights and tanh GELU; rotate_half RoPE, repeat_kv, SiLU
gating; Mixtral's softmax router, top-k renormalised; Qwen2-MoE's, renormalised or not, beside a sigmoid-gated shared
expert), and requires `loom eval --init-from DIR` to give the same loss to
relative 1e-5 (fp32 sums in another order), under tp 1 and, through
mpirun, tp 2 (with one key/value head replicated on both ranks) and pp 2.
Re-exporting the directory gives every tensor back bit for bit and the same
serial loss (as printed, to 6 decimals), and GPT-2's
directory holds the file `--format safetensors` writes. DeepSeek-V3's directory (MLA, noaux_tc routing, an MTP
module) is checked against hf_reference_deepseek.py's reference, its MTP loss too. Exits 77 (skipped) without
Debian's python3-torch.
Usage: tests/hf_reference.py MPIEXEC LOOM WORKDIR"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

try:
    import torch
except ImportError:
    # In CI (scripts/test.sh sets LOOM_REQUIRE_REFERENCES=1) the reference is required: its absence fails.
    required = os.environ.get("LOOM_REQUIRE_REFERENCES") == "1"
    print("%s: no torch (Debian's python3-torch) for the reference model%s"
          % (("FAIL", " (required: LOOM_REQUIRE_REFERENCES=1)") if required else ("SKIP", "")))
    sys.exit(1 if required else 77)

from hf_reference_deepseek import DEEPSEEK_V3_CONFIG, deepseek_v3_losses, deepseek_v3_weights
from hf_reference_ops import rms_norm, rotate_half  # noqa: E402 (after torch is known to be there)

mpiexec, loom, work = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
torch.manual_seed(0)
T = 48  # tokens per window; the models hold 64 positions
failures = 0


def run(args, ranks=1):
    cmd = [loom] + args if ranks == 1 else [mpiexec, "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS", "-np",
                                            str(ranks), loom] + args
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out.stdout + out.stderr


def write_safetensors(path, tensors, dtype="F32"):
    """A safetensors file in transformers' layout, values F32 or BF16 (as the Hub ships them); returns its data's bytes."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, t in tensors.items():
        t = t.contiguous()
        data = (t.to(torch.bfloat16).view(torch.int16) if dtype == "BF16" else t.to(torch.float32)).numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return offset


def write_shards(d, tensors, files):
    """tensors split into `files` shards with the index save_pretrained writes; returns the index."""
    names = list(tensors)
    per = -(-len(names) // files)
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    for i in range(files):
        shard = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        part = {k: tensors[k] for k in names[i * per:(i + 1) * per]}
        index["metadata"]["total_size"] += write_safetensors(os.path.join(d, shard), part, "BF16")
        index["weight_map"].update({k: shard for k in part})
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    return index


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    header.pop("__metadata__", None)
    out = {}
    for k, e in header.items():
        blob = bytearray(data[e["data_offsets"][0]:e["data_offsets"][1]])
        if e["dtype"] == "BF16":
            out[k] = torch.frombuffer(blob, dtype=torch.int16).view(torch.bfloat16).to(torch.float32).view(e["shape"])
        else:
            assert e["dtype"] == "F32"
            out[k] = torch.frombuffer(blob, dtype=torch.float32).view(e["shape"])
    return out


def weight(*shape, scale=0.3):
    return torch.randn(*shape) * scale


def norm_weight(n):
    return 1.0 + 0.2 * torch.randn(n)


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]  # Qwen2's config has none


def llama_weights(c):
    h, f, d = c["hidden_size"], c["intermediate_size"], head_dim(c)
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    w = {"model.embed_tokens.weight": weight(c["vocab_size"], h, scale=1.0)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight(h)
        w[p + "self_attn.q_proj.weight"] = weight(q, h)
        w[p + "self_attn.k_proj.weight"] = weight(kv, h)
        w[p + "self_attn.v_proj.weight"] = weight(kv, h)
        if c["model_type"] in ("qwen2", "qwen2_moe") or c.get("attention_bias"):  # biases on q, k and v (and o)
            for name, rows in (("q", q), ("k", kv), ("v", kv)):
                w[p + f"self_attn.{name}_proj.bias"] = weight(rows, scale=0.5)
        w[p + "self_attn.o_proj.weight"] = weight(h, q, scale=0.1)
        if c.get("attention_bias"):  # transformers' attention_bias: o's too
            w[p + "self_attn.o_proj.bias"] = weight(h, scale=0.5)
        if c["model_type"] in ("qwen3", "qwen3_moe"):  # QK-norm: an RMSNorm weight over each head's width, q's and k's
            w[p + "self_attn.q_norm.weight"] = norm_weight(d)
            w[p + "self_attn.k_norm.weight"] = norm_weight(d)
        w[p + "post_attention_layernorm.weight"] = norm_weight(h)
        w[p + "mlp.gate_proj.weight"] = weight(f, h)
        w[p + "mlp.up_proj.weight"] = weight(f, h)
        w[p + "mlp.down_proj.weight"] = weight(h, f, scale=0.1)
    w["model.norm.weight"] = norm_weight(h)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = weight(c["vocab_size"], h)
    return w


def softmax_with_sinks(scores, sinks):
    """Each head's softmax over [H, n, n] scores; GPT-OSS's sinks (one logit per head, or None) join every row's
    denominator and take no value."""
    if sinks is None:
        return torch.softmax(scores, -1)
    H, n = scores.shape[0], scores.shape[1]
    sink = sinks.view(H, 1, 1).expand(H, n, 1)
    return torch.softmax(torch.cat((scores, sink), -1), -1)[..., :-1]


def llama3_scaled(inv, scaling):
    """Llama 3.1's rope_scaling as transformers' _compute_llama3_parameters applies it to the inverse frequencies."""
    if not scaling:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    llama = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * llama / factor + smooth * llama
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, llama)


def sliding_window(c, i):
    """Layer i's window as transformers builds its mask (a key is seen where query - key < window), or None:
    Mistral's and Mixtral's every layer; the Qwen families' only with use_sliding_window, in the layers layer_types names
    sliding_attention (without it, from max_window_layers on)."""
    if c["model_type"] in ("mistral", "mixtral"):
        return c.get("sliding_window")
    if c["model_type"] == "gpt_oss":  # GptOssConfig: layer_types, every other layer from the first by default
        types = c.get("layer_types") or ["full_attention" if j % 2 else "sliding_attention"
                                         for j in range(c["num_hidden_layers"])]
        return c.get("sliding_window") if types[i] == "sliding_attention" else None
    if not c.get("use_sliding_window"):
        return None
    types = c.get("layer_types") or ["sliding_attention" if j >= c["max_window_layers"] else "full_attention"
                                     for j in range(c["num_hidden_layers"])]
    return c["sliding_window"] if types[i] == "sliding_attention" else None


def yarn_scaled(inv, scaling, d, theta, positions):
    """YaRN's frequencies and attention factor as transformers' _compute_yarn_parameters computes them: dims between
    the correction dims of beta_fast and beta_slow rotations ramp from kept to divided by factor."""
    factor = scaling["factor"]
    old = scaling.get("original_max_position_embeddings") or positions
    mscale = lambda s, m=1.0: 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
    attention = scaling.get("attention_factor") or mscale(factor)
    dim = lambda rot: (d * math.log(old / (rot * 2 * math.pi))) / (2 * math.log(theta))
    low, high = dim(scaling.get("beta_fast") or 32), dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return inv / factor * ramp + inv * (1 - ramp), attention


def llama_loss(c, w, tokens, mlp=None):
    x = w["model.embed_tokens.weight"][tokens[:-1]]  # [T, h]
    n, H, K, d = len(tokens) - 1, c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    inv, attention = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)), 1.0
    scaling = c.get("rope_scaling")
    if scaling and scaling.get("rope_type") == "yarn":
        inv, attention = yarn_scaled(inv, scaling, d, c["rope_theta"], c["max_position_embeddings"])
    else:
        inv = llama3_scaled(inv, scaling)
    ang = torch.outer(torch.arange(n, dtype=torch.float64), inv)  # cos and sin scaled by YaRN's attention factor
    cos, sin = (torch.cat((ang, ang), -1).cos() * attention).float(), (torch.cat((ang, ang), -1).sin() * attention).float()
    causal = torch.full((n, n), float("-inf")).triu(1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        window = sliding_window(c, i)
        mask = causal if not window else causal + torch.full((n, n), float("-inf")).tril(-window)
        a = rms_norm(x, w[p + "input_layernorm.weight"], c["rms_norm_eps"])
        linear = lambda x, name: x @ w[p + name + ".weight"].T + w.get(p + name + ".bias", 0)  # nn.Linear
        q = linear(a, "self_attn.q_proj").view(n, H, d).transpose(0, 1)
        k = linear(a, "self_attn.k_proj").view(n, K, d).transpose(0, 1)
        v = linear(a, "self_attn.v_proj").view(n, K, d).transpose(0, 1)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3's q_norm and k_norm over each head, before RoPE
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], c["rms_norm_eps"])
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], c["rms_norm_eps"])
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // K, 0), v.repeat_interleave(H // K, 0)  # repeat_kv
        att = softmax_with_sinks(q @ k.transpose(1, 2) / math.sqrt(d) + mask, w.get(p + "self_attn.sinks"))
        x = x + linear((att @ v).transpose(0, 1).reshape(n, H * d), "self_attn.o_proj")
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], c["rms_norm_eps"])
        if mlp:  # a Mixture of Experts
            x = x + mlp(p, m)
            continue
        gated = torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)
        x = x + gated @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"]
    logits = rms_norm(x, w["model.norm.weight"], c["rms_norm_eps"]) @ head.T
    return torch.nn.functional.cross_entropy(logits, tokens[1:]).item()


def mixtral_weights(c):
    """Llama's attention, each MLP Mixtral's: a router over num_local_experts experts, each SwiGLU's w1 (gate),
    w3 (up) and w2 (down). The router's weights are large, so no two of a token's scores nearly tie."""
    w = {k: v for k, v in llama_weights(c).items() if ".mlp." not in k}
    for i in range(c["num_hidden_layers"]):
        add_experts(w, f"model.layers.{i}.block_sparse_moe.", c["num_local_experts"], c["hidden_size"],
                    c["intermediate_size"], ("w1", "w3", "w2"))
    return w


def add_experts(w, p, E, h, f, names):
    """A router (p + gate.weight, large, so no two of a token's scores nearly tie) and E SwiGLU experts, each its
    gate, up and down projection under `names`."""
    w[p + "gate.weight"] = weight(E, h, scale=1.0)
    for e in range(E):
        w[p + f"experts.{e}.{names[0]}.weight"] = weight(f, h)
        w[p + f"experts.{e}.{names[1]}.weight"] = weight(f, h)
        w[p + f"experts.{e}.{names[2]}.weight"] = weight(h, f, scale=0.1)


def swiglu(x, w, gate, up, down):
    return (torch.nn.functional.silu(x @ w[gate].T) * (x @ w[up].T)) @ w[down].T


def top_k_mixture(m, router, k, experts, renormalise, expert):
    """A softmax over every expert's logit, the top k (renormalised over them when asked), each token's experts'
    outputs weighted and summed."""
    top, chosen = torch.softmax(m @ router.T, -1).topk(k, -1)
    if renormalise:
        top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(m)
    for j in range(chosen.shape[1]):
        for e in range(experts):
            rows = chosen[:, j] == e
            if rows.any():
                out[rows] += top[rows, j:j + 1] * expert(m[rows], e)
    return out


def mixtral_moe(c, w, p, m):
    """transformers' MixtralSparseMoeBlock: the top k renormalised, each expert SwiGLU's w1 (gate), w3 (up), w2 (down)."""
    return top_k_mixture(m, w[p + "gate.weight"], c["num_experts_per_tok"], c["num_local_experts"], True,
                         lambda x, e: swiglu(x, w, *(p + f"experts.{e}.{n}.weight" for n in ("w1", "w3", "w2"))))


def mixtral_loss(c, w, tokens):
    return llama_loss(c, w, tokens, mlp=lambda p, m: mixtral_moe(c, w, p + "block_sparse_moe.", m))


def qwen2_moe_weights(c):
    """Qwen2's attention, each MLP Qwen2-MoE's: a router over num_experts experts of moe_intermediate_size
    (gate_proj, up_proj, down_proj each), a shared expert of shared_expert_intermediate_size and its gate, one row.
    The router's weights are large, so no two of a token's scores nearly tie."""
    dense = set(c["mlp_only_layers"])  # these keep Llama's MLP of intermediate_size
    w = {k: v for k, v in llama_weights(c).items() if ".mlp." not in k or int(k.split(".")[2]) in dense}
    h, f, s, E = c["hidden_size"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"], c["num_experts"]
    for i in (i for i in range(c["num_hidden_layers"]) if i not in dense):
        p = f"model.layers.{i}.mlp."
        w[p + "gate.weight"] = weight(E, h, scale=1.0)
        for e, rows in [(f"experts.{e}.", f) for e in range(E)] + [("shared_expert.", s)]:
            w[p + e + "gate_proj.weight"] = weight(rows, h)
            w[p + e + "up_proj.weight"] = weight(rows, h)
            w[p + e + "down_proj.weight"] = weight(h, rows, scale=0.1)
        w[p + "shared_expert_gate.weight"] = weight(1, h, scale=1.0)
    return w


def qwen2_moe_loss(c, w, tokens):
    """transformers' Qwen2MoeSparseMoeBlock: softmax over every expert, the top k (renormalised only with
    norm_topk_prob), each token's experts' SwiGLU outputs weighted and summed, plus the shared expert's output
    times the sigmoid of its gate."""
    def moe(p, m):
        mlp = lambda x, e: swiglu(x, w, *(p + e + n for n in ("gate_proj.weight", "up_proj.weight", "down_proj.weight")))
        out = top_k_mixture(m, w[p + "gate.weight"], c["num_experts_per_tok"], c["num_experts"], c["norm_topk_prob"],
                            lambda x, e: mlp(x, f"experts.{e}."))
        return out + torch.sigmoid(m @ w[p + "shared_expert_gate.weight"].T) * mlp(m, "shared_expert.")
    dense = lambda p, m: swiglu(m, w, *(p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")))
    return llama_loss(c, w, tokens, mlp=lambda p, m: (dense if int(p.split(".")[2]) in c["mlp_only_layers"] else
                                                      lambda p, m: moe(p + "mlp.", m))(p, m))


def qwen3_moe_weights(c):
    """Qwen3's attention, each MLP but those of mlp_only_layers Qwen3-MoE's: a router over num_experts experts of
    moe_intermediate_size (gate_proj, up_proj, down_proj each), no shared expert. The router's weights are large, so no
    two of a token's scores nearly tie."""
    dense = set(c["mlp_only_layers"])
    w = {k: v for k, v in llama_weights(c).items() if ".mlp." not in k or int(k.split(".")[2]) in dense}
    for i in (i for i in range(c["num_hidden_layers"]) if i not in dense):
        add_experts(w, f"model.layers.{i}.mlp.", c["num_experts"], c["hidden_size"], c["moe_intermediate_size"],
                    ("gate_proj", "up_proj", "down_proj"))
    return w


def qwen3_moe_loss(c, w, tokens):
    """transformers' Qwen3MoeSparseMoeBlock: softmax over every expert, the top k (renormalised with norm_topk_prob),
    each token's experts' SwiGLU outputs weighted and summed; the layers of mlp_only_layers keep Qwen3's dense MLP."""
    def mlp(p, m):
        if int(p.split(".")[2]) in c["mlp_only_layers"]:
            return swiglu(m, w, *(p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")))
        expert = lambda x, e: swiglu(x, w, *(p + f"mlp.experts.{e}.{n}_proj.weight" for n in ("gate", "up", "down")))
        return top_k_mixture(m, w[p + "mlp.gate.weight"], c["num_experts_per_tok"], c["num_experts"], c["norm_topk_prob"],
                             expert)
    return llama_loss(c, w, tokens, mlp=mlp)


def gpt_oss_weights(c):
    """Llama's attention with biases on q, k, v and o and each head's sink logit; each MLP GPT-OSS's: a router with
    a bias, and the experts stacked as its files hold them: gate_up_proj [E, h, 2f] (gate j in column 2j, up j in
    2j + 1, x @ it) with its bias [E, 2f], down_proj [E, f, h] with its bias [E, h]. The router's weights are large, so
    no two of a token's logits nearly tie; the experts' are large enough that the clamp at swiglu_limit bites."""
    w = {k: v for k, v in llama_weights(c).items() if ".mlp." not in k}
    h, f, E, H = c["hidden_size"], c["intermediate_size"], c["num_local_experts"], c["num_attention_heads"]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.sinks"] = weight(H, scale=1.0)
        w[p + "mlp.router.weight"], w[p + "mlp.router.bias"] = weight(E, h, scale=1.0), weight(E, scale=0.5)
        w[p + "mlp.experts.gate_up_proj"] = weight(E, h, 2 * f, scale=0.6)
        w[p + "mlp.experts.gate_up_proj_bias"] = weight(E, 2 * f, scale=0.5)
        w[p + "mlp.experts.down_proj"] = weight(E, f, h, scale=0.1)
        w[p + "mlp.experts.down_proj_bias"] = weight(E, h, scale=0.5)
    return w


def gpt_oss_loss(c, w, tokens):
    """transformers' GptOssMLP: the router's logits (with its bias), their top k softmaxed, each token's experts'
    outputs weighted and summed; an expert's unit clamps gate above and up both ways at swiglu_limit, then
    (up + 1) gate sigmoid(1.702 gate)."""
    limit, clamped = c["swiglu_limit"], 0

    def moe(p, m):
        nonlocal clamped
        p += "mlp."
        top, chosen = (m @ w[p + "router.weight"].T + w[p + "router.bias"]).topk(c["num_experts_per_tok"], -1)
        top = torch.softmax(top, -1)
        out = torch.zeros_like(m)
        for j in range(chosen.shape[1]):
            for e in range(c["num_local_experts"]):
                rows = chosen[:, j] == e
                if not rows.any():
                    continue
                gate_up = m[rows] @ w[p + "experts.gate_up_proj"][e] + w[p + "experts.gate_up_proj_bias"][e]
                gate, up = gate_up[..., ::2], gate_up[..., 1::2]
                clamped += int((gate > limit).sum() + (up.abs() > limit).sum())
                gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
                y = ((up + 1) * gate * torch.sigmoid(gate * 1.702)) @ w[p + "experts.down_proj"][e]
                out[rows] += top[rows, j:j + 1] * (y + w[p + "experts.down_proj_bias"][e])
        return out
    loss = llama_loss(c, w, tokens, mlp=moe)
    assert clamped > 0, "the reference's weights never reach the clamp"
    return loss


# GPT-OSS's config.json as OpenAI's is written (its fields, OpenAI's experts_per_token and initial_context_length among
# them; small sizes): heads 24 wide, a window of 8 keys in the first layer, YaRN over 16 original positions.
GPT_OSS_CONFIG = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 256, "hidden_size": 64,
                  "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 24, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 150000.0,
                  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 4.0,
                                   "original_max_position_embeddings": 16, "rope_type": "yarn", "truncate": False},
                  "hidden_act": "silu", "attention_bias": True, "attention_dropout": 0.0, "sliding_window": 8,
                  "layer_types": ["sliding_attention", "full_attention"], "num_local_experts": 4,
                  "num_experts_per_tok": 2, "experts_per_token": 2, "router_aux_loss_coef": 0.9,
                  "output_router_logits": False, "swiglu_limit": 7.0, "initial_context_length": 16,
                  "tie_word_embeddings": False, "torch_dtype": "float32", "eos_token_id": 200002, "pad_token_id": 199999,
                  "initializer_range": 0.02, "use_cache": True, "transformers_version": "4.55.0.dev0"}


# Qwen3 and Qwen3-MoE config.json files as the Qwen team's are written (their fields, small sizes): heads 24 wide where
# hidden / heads is 16, so a reader that ignores head_dim fails.
QWEN3_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 256, "hidden_size": 64,
                "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 24, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                "rope_scaling": None, "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
                "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2, "tie_word_embeddings": False,
                "torch_dtype": "float32", "bos_token_id": 151643, "eos_token_id": 151645, "initializer_range": 0.02,
                "use_cache": True, "transformers_version": "4.51.0"}
QWEN3_MOE_CONFIG = {**QWEN3_CONFIG, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                    "intermediate_size": 96, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [0], "router_aux_loss_coef": 0.001,
                    "output_router_logits": False}


def check_written(name, config, weights_of, loss_of, layouts):
    """A directory this script writes whole, config.json included (as the Hub ships one, not as loom's export
    writes it), evaluates to the reference's loss under each layout; loom's export of it gives every tensor back bit
    for bit, and a config.json whose every field that transformers reads is the original's."""
    global failures
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    w = weights_of(config)
    write_safetensors(os.path.join(d, "model.safetensors"), w)
    evaluate(name, d, loss_of(config, w, tokens), layouts)
    again = os.path.join(work, name + "_again")
    run(["ckpt", "export", "--init-from", d, "--format", "hf", "-o", again])
    with open(os.path.join(again, "config.json")) as f:
        back_config = json.load(f)
    ids = ("bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "transformers_version",
           "experts_per_token", "initial_context_length")  # not the model, or OpenAI's names for fields transformers reads
    # transformers adds the router's loss only with output_router_logits: the coefficient it trains with is 0 without.
    router_loss = lambda c: c["router_aux_loss_coef"] if c.get("output_router_logits") else 0.0
    changed = [k for k in config if k not in ids + ("router_aux_loss_coef",) and back_config.get(k, "absent") != config[k]]
    if "router_aux_loss_coef" in config and router_loss(back_config) != router_loss(config):
        changed.append("router_aux_loss_coef")
    back = read_safetensors(os.path.join(again, "model.safetensors"))
    same = back.keys() == w.keys() and all(torch.equal(back[k], w[k]) for k in w)
    failures += not same or bool(changed)
    print(f"{'ok' if same and not changed else 'FAIL'}: {name}: re-exported, {len(back)} tensors "
          f"{'the same' if same else 'CHANGED'}, config.json {'the same' if not changed else 'CHANGED: ' + str(changed)}")


def gpt2_weights(c):
    h, f = c["n_embd"], c["n_inner"] or 4 * c["n_embd"]
    w = {"wte.weight": weight(c["vocab_size"], h, scale=1.0), "wpe.weight": weight(c["n_positions"], h)}
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        w[p + "ln_1.weight"], w[p + "ln_1.bias"] = norm_weight(h), weight(h, scale=0.1)
        w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"] = weight(h, 3 * h), weight(3 * h, scale=0.1)
        w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"] = weight(h, h, scale=0.1), weight(h, scale=0.1)
        w[p + "ln_2.weight"], w[p + "ln_2.bias"] = norm_weight(h), weight(h, scale=0.1)
        w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = weight(h, f), weight(f, scale=0.1)
        w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"] = weight(f, h, scale=0.1), weight(h, scale=0.1)
    w["ln_f.weight"], w["ln_f.bias"] = norm_weight(h), weight(h, scale=0.1)
    return w


def gpt2_loss(c, w, tokens):
    n, H, h = len(tokens) - 1, c["n_head"], c["n_embd"]
    d, eps = h // H, c["layer_norm_epsilon"]
    ln = lambda x, p: torch.nn.functional.layer_norm(x, (h,), w[p + ".weight"], w[p + ".bias"], eps)
    conv1d = lambda x, p: x @ w[p + ".weight"] + w[p + ".bias"]  # Conv1D: weights [in, out]
    x = w["wte.weight"][tokens[:-1]] + w["wpe.weight"][:n]
    mask = torch.full((n, n), float("-inf")).triu(1)
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(h, -1)
        q, k, v = (t.view(n, H, d).transpose(0, 1) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d) + mask, -1)
        x = x + conv1d((att @ v).transpose(0, 1).reshape(n, h), p + "attn.c_proj")
        fc = torch.nn.functional.gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
        x = x + conv1d(fc, p + "mlp.c_proj")
    logits = ln(x, "ln_f") @ w["wte.weight"].T
    return torch.nn.functional.cross_entropy(logits, tokens[1:]).item()


def evaluate(name, d, want, layouts):
    """loom's loss of directory d under each (ranks, flags) layout against the reference's, to relative 1e-5;
    returns the first layout's."""
    global failures
    first = None
    for ranks, layout in layouts:
        out = run(["eval", "--init-from", d, "--data", data, "--batches", "1", "--micro-batch", "1", "--seq", str(T)]
                  + layout, ranks)
        got = float(out.split("mean loss ")[1].split()[0])
        first = got if first is None else first
        ok = abs(got - want) <= 1e-5 * abs(want)
        failures += not ok
        print(f"{'ok' if ok else 'FAIL'}: {name} {' '.join(layout) or 'serial'}: loom {got:.6f}, reference {want:.6f}")
    return first


def check(name, model_flags, weights_of, loss_of, layouts, config_edit=None):
    global failures
    d = os.path.join(work, name)
    run(["ckpt", "export", "--format", "hf", "-o", d] + model_flags)
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    if config_edit:  # a field loom's own export would not write, set as a Hub config sets it
        config.update(config_edit)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    w = weights_of(config)
    write_safetensors(os.path.join(d, "model.safetensors"), w)
    serial = evaluate(name, d, loss_of(config, w, tokens), layouts)
    again = os.path.join(work, name + "_again")
    run(["ckpt", "export", "--init-from", d, "--format", "hf", "-o", again])
    with open(os.path.join(d, "config.json"), "rb") as a, open(os.path.join(again, "config.json"), "rb") as b:
        if config_edit:  # a Mistral comes back as the Llama it computes (transformers loads its weights either way)
            renamed = ("architectures", "model_type", "sliding_window") if "architectures" in config_edit else ()
            mine = {k: v for k, v in json.loads(a.read()).items() if k not in renamed}
            back_config = {k: v for k, v in json.loads(b.read()).items() if k not in renamed[:2]}
            same_config = mine == back_config
        else:
            same_config = a.read() == b.read()
    back = read_safetensors(os.path.join(again, "model.safetensors"))
    out = run(["eval", "--init-from", again, "--data", data, "--batches", "1", "--micro-batch", "1", "--seq", str(T)])
    same = same_config and back.keys() == w.keys() and all(torch.equal(back[k], w[k]) for k in w) and \
        float(out.split("mean loss ")[1].split()[0]) == serial
    failures += not same
    print(f"{'ok' if same else 'FAIL'}: {name}: re-exported, {len(back)} tensors, config.json and the loss "
          f"{'the same' if same else 'changed'}")


# What a Hub Llama 3.1 config.json holds beside the shape: its RoPE scaling (the original
# length shrunk to 64 positions so that llama-tiny's 16-wide heads have a frequency in each
# band: kept, interpolated, divided by the factor), base, token ids and dtype.
LLAMA31_HUB_FIELDS = {"rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64, "rope_type": "llama3"},
                      "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
                      "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0", "use_cache": True}


def check_sharded():
    """A Llama 3.1 directory in shards, as the Hub ships one (its config's
    fields, BF16 values, three shards and their index), evaluates to the reference's loss of the same
    bf16 weights, serial and tp 2; loom's export with a small
    --max-shard-size writes several shards, each at most that size but for
    a lone larger tensor, that give every tensor back exactly; and broken
    shard sets are refused by name."""
    global failures
    d = os.path.join(work, "sharded")
    run(["ckpt", "export", "--format", "hf", "-o", d, "--model", "llama-tiny", "--layers", "2"])
    os.remove(os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    config.update(LLAMA31_HUB_FIELDS)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    w = {k: v.to(torch.bfloat16).to(torch.float32) for k, v in llama_weights(config).items()}
    index = write_shards(d, w, 3)
    want = llama_loss(config, w, tokens)
    for ranks, layout in [(1, []), (2, ["--tp", "2"])]:
        out = run(["eval", "--init-from", d, "--data", data, "--batches", "1", "--micro-batch", "1", "--seq", str(T)]
                  + layout, ranks)
        got = float(out.split("mean loss ")[1].split()[0])
        ok = abs(got - want) <= 1e-5 * abs(want)
        failures += not ok
        print(f"{'ok' if ok else 'FAIL'}: 3 bf16 shards {' '.join(layout) or 'serial'}: loom {got:.6f}, reference {want:.6f}")
    # Back out in shards of at most 64 KiB.
    out_dir, most = os.path.join(work, "sharded_out"), 65536
    run(["ckpt", "export", "--init-from", d, "--format", "hf", "--dtype", "bf16", "--max-shard-size", "64KiB", "-o", out_dir])
    with open(os.path.join(out_dir, "model.safetensors.index.json")) as f:
        written = json.load(f)
    shards = sorted(set(written["weight_map"].values()))
    back, sizes_ok = {}, True
    for name in shards:
        part = read_safetensors(os.path.join(out_dir, name))
        size = sum(t.numel() * 2 for t in part.values())
        sizes_ok &= size <= most or len(part) == 1
        sizes_ok &= all(written["weight_map"][k] == name for k in part)
        back.update(part)
    total = sum(t.numel() * 2 for t in back.values())
    same = len(shards) > 3 and sizes_ok and written["metadata"]["total_size"] == total and \
        not os.path.exists(os.path.join(out_dir, "model.safetensors")) and \
        back.keys() == w.keys() and all(torch.equal(back[k], w[k]) for k in w)
    failures += not same
    print(f"{'ok' if same else 'FAIL'}: exported in {len(shards)} shards of at most {most} bytes, {len(back)} tensors back "
          f"{'exactly' if same else 'WRONG'}")
    # Broken shard sets, each refused with a message that names the problem.
    first = next(k for k, v in index["weight_map"].items() if v == "model-00001-of-00003.safetensors")
    breaks = {
        "a shard missing": (lambda b: os.remove(os.path.join(b, "model-00002-of-00003.safetensors")),
                            "model-00002-of-00003.safetensors"),
        "a tensor in two shards": (lambda b: write_safetensors(
            os.path.join(b, "model-00003-of-00003.safetensors"),
            {**read_safetensors(os.path.join(b, "model-00003-of-00003.safetensors")), first: w[first]}, "BF16"), "is in both"),
        "the index naming a tensor no shard has": (lambda b: edit_index(b, lambda i: i["weight_map"].update(
            {"model.layers.9.mlp.up_proj.weight": "model-00001-of-00003.safetensors"})), "which does not hold it"),
        "a total size that lies": (lambda b: edit_index(b, lambda i: i["metadata"].update(
            total_size=i["metadata"]["total_size"] + 2)), "metadata.total_size"),
    }
    for what, (breaker, words) in breaks.items():
        b = os.path.join(work, "broken")
        shutil.rmtree(b, ignore_errors=True)
        shutil.copytree(d, b)
        breaker(b)
        res = subprocess.run([loom, "eval", "--init-from", b, "--data", data, "--batches", "1", "--micro-batch", "1"],
                             capture_output=True, text=True)
        lines = res.stderr.strip().splitlines()
        ok = res.returncode == 2 and len(lines) == 1 and words in lines[0]
        failures += not ok
        print(f"{'ok' if ok else 'FAIL'}: {what}: exit {res.returncode}, {lines}")


def expect_config_refused(name, field, value, also=None):
    """Directory `name` with one config.json field set to value (None: removed), and the fields `also` sets, is refused
    in one line naming the first."""
    global failures
    bad = os.path.join(work, name + "_bad")
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(os.path.join(work, name), bad)
    with open(os.path.join(bad, "config.json")) as f:
        config = json.load(f)
    if value is None:
        del config[field]
    else:
        config[field] = value
    config.update(also or {})
    with open(os.path.join(bad, "config.json"), "w") as f:
        json.dump(config, f)
    res = subprocess.run([loom, "eval", "--init-from", bad, "--data", data, "--batches", "1", "--micro-batch", "1"],
                         capture_output=True, text=True)
    lines = res.stderr.strip().splitlines()
    ok = res.returncode == 2 and len(lines) == 1 and f'field "{field}"' in lines[0]
    failures += not ok
    print(f"{'ok' if ok else 'FAIL'}: a {name} config with {field} {'absent' if value is None else value}: exit "
          f"{res.returncode}, {lines}")


def edit_index(d, change):
    path = os.path.join(d, "model.safetensors.index.json")
    with open(path) as f:
        index = json.load(f)
    change(index)
    with open(path, "w") as f:
        json.dump(index, f)


data = os.path.join(work, "text.bin")
run(["data", "prepare", "/usr/share/common-licenses/GPL-3", "-o", data])
with open(data, "rb") as f:
    raw = f.read()
tokens = torch.tensor(struct.unpack(f"<{T + 1}H", raw[1024:1024 + 2 * (T + 1)]), dtype=torch.long)
check("llama", ["--model", "llama-tiny", "--layers", "2"], llama_weights, llama_loss,
      [(1, []), (2, ["--tp", "2"]), (2, ["--pp", "2"])])
check("mqa", ["--model", "llama-tiny", "--kv-heads", "1", "--rope-theta", "500"], llama_weights, llama_loss,
      [(1, []), (2, ["--tp", "2"])])
check("llama31", ["--model", "llama-tiny", "--layers", "2"], llama_weights, llama_loss, [(1, []), (2, ["--tp", "2"])],
      {"rope_scaling": LLAMA31_HUB_FIELDS["rope_scaling"]})
# YaRN as GPT-OSS configures it (no truncation; 64 positions from 16 original, factor 4, so the ramp spans a 16-wide
# head's dims), its attention factor 0.1 ln 4 + 1 on cos and sin; and truncated with an explicit attention factor.
check("llama_yarn", ["--model", "llama-tiny", "--layers", "2"], llama_weights, llama_loss, [(1, []), (2, ["--tp", "2"])],
      {"rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                        "truncate": False, "rope_type": "yarn"}, "rope_theta": 150000.0})
check("llama_yarn_truncated", ["--model", "llama-tiny", "--layers", "2"], llama_weights, llama_loss, [(1, []), (2, ["--pp", "2"])],
      {"rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 16.0, "beta_slow": 2.0,
                        "attention_factor": 1.25, "rope_type": "yarn"}})
# Mistral: Llama's model under another name, with a sliding window as long as the sequence.
check("mistral", ["--model", "llama-tiny", "--layers", "2"], llama_weights, llama_loss, [(1, []), (2, ["--tp", "2"])],
      {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 64})
# Qwen2: biases on q, k and v only, loom's --qkv-bias; untied, and tied as the small Qwen2.5 models ship.
check("qwen2", ["--model", "llama-tiny", "--layers", "2", "--qkv-bias"], llama_weights, llama_loss,
      [(1, []), (2, ["--tp", "2"]), (2, ["--pp", "2"])])
check("qwen2_tied", ["--model", "llama-tiny", "--layers", "2", "--qkv-bias"], llama_weights, llama_loss,
      [(1, []), (2, ["--tp", "2"])], {"tie_word_embeddings": True})
check("gpt2", ["--model", "gpt-tiny"], gpt2_weights, gpt2_loss, [(1, []), (2, ["--tp", "2"])])
# Mixtral: 4 experts of 32, top 2, under tp 2 (each rank routing every token) and with sequence parallelism (each its own).
check("mixtral", ["--model", "moe-tiny", "--num-experts", "4", "--moe-ffn-hidden-size", "32"], mixtral_weights, mixtral_loss,
      [(1, []), (2, ["--tp", "2"]), (2, ["--tp", "2", "--sequence-parallel"]), (2, ["--pp", "2"])])
# Qwen2-MoE: 4 experts of 32, top 2, a gated shared expert of 48, biases on q, k and v; the probabilities taken as they
# are (norm_topk_prob false, as Qwen1.5-MoE ships) and renormalised (loom's own export); and with layer 0's MLP dense
# (mlp_only_layers [0], loom's --moe-layer-freq ([0]+[1]), its tensors Qwen2's dense ones).
QWEN2_MOE = ["--model", "moe-tiny", "--num-experts", "4", "--moe-ffn-hidden-size", "32", "--qkv-bias",
             "--moe-shared-expert-intermediate-size", "48", "--moe-shared-expert-gate"]
check("qwen2_moe", QWEN2_MOE, qwen2_moe_weights, qwen2_moe_loss,
      [(1, []), (2, ["--tp", "2", "--sequence-parallel"]), (2, ["--pp", "2"])], {"norm_topk_prob": False})
check("qwen2_moe_renormalised", QWEN2_MOE, qwen2_moe_weights, qwen2_moe_loss, [(1, []), (2, ["--tp", "2"])])
check("qwen2_moe_dense_first", QWEN2_MOE + ["--moe-layer-freq", "([0]+[1])"], qwen2_moe_weights, qwen2_moe_loss,
      [(1, []), (2, ["--tp", "2", "--sequence-parallel"]), (2, ["--pp", "2"])])
# decoder_sparse_step 2 makes the odd layers' MLPs the MoE ones: layer 0 dense, layer 1 MoE, as mlp_only_layers [0] does.
bad = os.path.join(work, "qwen2_moe_step")
shutil.rmtree(bad, ignore_errors=True)
shutil.copytree(os.path.join(work, "qwen2_moe_dense_first"), bad)
with open(os.path.join(bad, "config.json")) as f:
    config = json.load(f)
config["mlp_only_layers"], config["decoder_sparse_step"] = [], 2
with open(os.path.join(bad, "config.json"), "w") as f:
    json.dump(config, f)
out = run(["eval", "--init-from", bad, "--data", data, "--batches", "1", "--micro-batch", "1", "--seq", str(T)])
got = float(out.split("mean loss ")[1].split()[0])
with open(os.path.join(work, "qwen2_moe_dense_first", "config.json")) as f:
    want = qwen2_moe_loss(json.load(f), read_safetensors(os.path.join(bad, "model.safetensors")), tokens)
ok = abs(got - want) <= 1e-5 * abs(want)
failures += not ok
print(f"{'ok' if ok else 'FAIL'}: a Qwen2-MoE config with decoder_sparse_step 2: loom {got:.6f}, reference {want:.6f}")
# A Mixtral config.json loom cannot compute is refused by name: router noise, a bias field.
for field, value in (("router_jitter_noise", 0.1), ("attention_bias", False)):
    expect_config_refused("mixtral", field, value)
check_sharded()
check_written("qwen3", QWEN3_CONFIG, llama_weights, llama_loss, [(1, []), (2, ["--tp", "2"]), (2, ["--pp", "2"])])
# Biases on q, k, v and o, none on the MLPs: Qwen3's attention_bias, and Llama's attention_bias without mlp_bias
# (loom's --qkv-bias --out-bias, written back as Llama's).
check_written("qwen3_attention_bias", {**QWEN3_CONFIG, "attention_bias": True}, llama_weights, llama_loss,
              [(1, []), (2, ["--tp", "2"])])
check("llama_attention_bias", ["--model", "llama-tiny", "--layers", "2", "--qkv-bias", "--out-bias"], llama_weights,
      llama_loss, [(1, []), (2, ["--tp", "2"]), (2, ["--pp", "2"])])
# Sliding windows of 8 keys (a query's own and the 7 before it) over the 48-token window: Qwen3's second layer alone
# (layer_types, max_window_layers 1), and Mistral's every layer (loom's --window-size 7,0 written as sliding_window 8).
check_written("qwen3_window", {**QWEN3_CONFIG, "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1,
                               "layer_types": ["full_attention", "sliding_attention"]}, llama_weights, llama_loss,
              [(1, []), (2, ["--tp", "2"]), (2, ["--cp", "2"])])
check("mistral_window", ["--model", "llama-tiny", "--layers", "2", "--window-size", "7,0"], llama_weights, llama_loss,
      [(1, []), (2, ["--tp", "2"]), (2, ["--pp", "2"])])
check_written("qwen3_moe", QWEN3_MOE_CONFIG, qwen3_moe_weights, qwen3_moe_loss,
              [(1, []), (2, ["--tp", "2", "--sequence-parallel"]), (2, ["--pp", "2"])])
# A Qwen3 config.json loom cannot compute is refused by name: biases on the MLPs, no head width, a shared expert.
for family, field, value in (("qwen3", "mlp_bias", True), ("qwen3", "head_dim", None),
                             ("qwen3_moe", "shared_expert_intermediate_size", 64)):
    expect_config_refused(family, field, value)
# GPT-OSS: sinks, a window of 8 keys in its first layer, YaRN, a biased router over 4 biased experts (top 2) with the
# clamped unit, stacked in the file; serial, tp 2 with SP, pp 2, cp 2 (the window shorter than a rank's chunks, the
# sinks merged once after the ring), and ep 2 over dp 2 and over tp 2 with SP.
check_written("gpt_oss", GPT_OSS_CONFIG, gpt_oss_weights, gpt_oss_loss,
              [(1, []), (2, ["--tp", "2", "--sequence-parallel"]), (2, ["--pp", "2"]), (2, ["--cp", "2"]),
               (2, ["--ep", "2", "--dp", "2"]), (2, ["--ep", "2", "--tp", "2", "--sequence-parallel"])])
# A GPT-OSS config.json loom cannot compute is refused by name: the released MXFP4 experts, no head width, no biases on
# the attention, OpenAI's top-k disagreeing with transformers'.
for field, value in (("quantization_config", {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}),
                     ("head_dim", None), ("attention_bias", False), ("experts_per_token", 3)):
    expect_config_refused("gpt_oss", field, value)


def check_deepseek_v3():
    """A DeepSeek-V3 directory as DeepSeek's are written (hf_reference_deepseek.py): the main loss under each layout,
    the re-export (its correction biases and the MTP module's copies of the embedding and head among the tensors), and
    the MTP module's loss, which loom eval reports apart, against the paper's objective, serial and with the module on
    pp 2's last stage; a config loom cannot compute refused by name."""
    global failures
    weights = lambda c: deepseek_v3_weights(c, weight, norm_weight)
    check_written("deepseek_v3", DEEPSEEK_V3_CONFIG, weights, lambda c, w, t: deepseek_v3_losses(c, w, t, yarn_scaled)[0],
                  [(1, []), (2, ["--tp", "2", "--sequence-parallel"]), (2, ["--pp", "2"]), (2, ["--cp", "2"]),
                   (2, ["--ep", "2", "--dp", "2"])])
    d = os.path.join(work, "deepseek_v3")
    want = deepseek_v3_losses(DEEPSEEK_V3_CONFIG, read_safetensors(os.path.join(d, "model.safetensors")), tokens,
                              yarn_scaled)[1]
    for ranks, layout in ((1, []), (2, ["--pp", "2"]), (2, ["--cp", "2"])):
        out = run(["eval", "--init-from", d, "--data", data, "--batches", "1", "--micro-batch", "1", "--seq", str(T)]
                  + layout, ranks)
        got = float(out.split("mtp loss ")[1].split()[0]) if "mtp loss " in out else float("nan")
        ok = abs(got - want) <= 1e-5 * abs(want)
        failures += not ok
        print(f"{'ok' if ok else 'FAIL'}: deepseek_v3 MTP {' '.join(layout) or 'serial'}: loom {got:.6f}, reference {want:.6f}")
    for field, value in (("quantization_config", {"quant_method": "fp8", "weight_block_size": [128, 128]}),
                         ("rope_interleave", False), ("topk_group", 1), ("scoring_func", "softmax")):
        expect_config_refused("deepseek_v3", field, value)
    expect_config_refused("deepseek_v3", "n_shared_experts", 4096, {"moe_intermediate_size": 4096})  # 2^24 wide


check_deepseek_v3()
# GPT-2's directory holds the same safetensors file as the single-file export.
run(["ckpt", "export", "--model", "gpt-tiny", "--format", "hf", "-o", os.path.join(work, "gpt2_hf")])
run(["ckpt", "export", "--model", "gpt-tiny", "--format", "safetensors", "-o", os.path.join(work, "gpt2.safetensors")])
with open(os.path.join(work, "gpt2_hf", "model.safetensors"), "rb") as a, open(os.path.join(work, "gpt2.safetensors"), "rb") as b:
    same = a.read() == b.read()
failures += not same
print(f"{'ok' if same else 'FAIL'}: gpt2: --format hf and --format safetensors write the same weights file")
sys.exit(1 if failures else 0)
