"""DeepSeek-V3 for tests/hf_reference.py, written here from the models' definitions, not from loom:

- the main model as transformers' DeepseekV3ForCausalLM computes it (modeling_deepseek_v3.py): multi-head latent
  attention (q through its latent and RMSNorm, keys and values from one compressed latent and its RMSNorm beside a
  RoPE key every head shares), RoPE on the decoupled parts after rope_interleave's reordering of each pair of rows
  (dims 2j, 2j + 1 to j, j + d/2) with YaRN's frequencies and attention factor (mscale over mscale_all_dim), the
  softmax scale times get_mscale(factor, mscale_all_dim)^2; the first first_k_dense_replace layers' SwiGLU MLPs,
  then noaux_tc routing: sigmoid scores, the correction bias added for choosing, groups scored by their best two,
  the top-k among the best topk_group groups (the others' masked out, as DeepSeek's own inference code masks them:
  -inf; the correction biases here are positive, so transformers' masked_fill of 0 chooses the same), the chosen
  scores normalised (norm_topk_prob) and scaled (routed_scaling_factor), beside the shared experts;
- its multi-token prediction modules as DeepSeek-V3's paper and Megatron-Core's MultiTokenPredictionLayer define
  them, with the tensors DeepSeek's checkpoints name (vLLM's DeepSeekMTP reads the same): module k sees the main
  model's final-norm output (module k - 1's shared_head.norm output after the first) at position t and the
  embedding of input token t + k, eh_proj([enorm(embedding) | hnorm(hidden)]), its transformer layer,
  shared_head.norm, and shared_head.head; its loss at t predicts token t + k + 1, summed over the positions that
  have one and divided by the main loss's count (the paper's 1/T), the modules' losses averaged."""
import math

import torch

from hf_reference_ops import rms_norm, rotate_half


def get_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def deepseek_v3_weights(c, weight, norm_weight):
    h, H, V = c["hidden_size"], c["num_attention_heads"], c["vocab_size"]
    nope, rope, v, rq, rkv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["q_lora_rank"], c["kv_lora_rank"]
    E, fe, f = c["n_routed_experts"], c["moe_intermediate_size"], c["intermediate_size"]
    shared = (c["n_shared_experts"] or 0) * fe
    L, D = c["num_hidden_layers"], c.get("num_nextn_predict_layers", 0)
    w = {"model.embed_tokens.weight": weight(V, h, scale=1.0)}
    for i in range(L + D):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight(h)
        if rq:
            w[p + "self_attn.q_a_proj.weight"] = weight(rq, h)
            w[p + "self_attn.q_a_layernorm.weight"] = norm_weight(rq)
            w[p + "self_attn.q_b_proj.weight"] = weight(H * (nope + rope), rq)
        else:
            w[p + "self_attn.q_proj.weight"] = weight(H * (nope + rope), h)
        w[p + "self_attn.kv_a_proj_with_mqa.weight"] = weight(rkv + rope, h)
        w[p + "self_attn.kv_a_layernorm.weight"] = norm_weight(rkv)
        w[p + "self_attn.kv_b_proj.weight"] = weight(H * (nope + v), rkv)
        w[p + "self_attn.o_proj.weight"] = weight(h, H * v, scale=0.1)
        w[p + "post_attention_layernorm.weight"] = norm_weight(h)
        if i < c["first_k_dense_replace"]:
            w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = weight(f, h), weight(f, h)
            w[p + "mlp.down_proj.weight"] = weight(h, f, scale=0.1)
        else:  # a router large enough that no two of a token's scores nearly tie; positive correction biases
            w[p + "mlp.gate.weight"] = weight(E, h, scale=1.0)
            w[p + "mlp.gate.e_score_correction_bias"] = 0.2 * torch.rand(E)
            for e in range(E):
                w[p + f"mlp.experts.{e}.gate_proj.weight"] = weight(fe, h)
                w[p + f"mlp.experts.{e}.up_proj.weight"] = weight(fe, h)
                w[p + f"mlp.experts.{e}.down_proj.weight"] = weight(h, fe, scale=0.1)
            if shared:
                w[p + "mlp.shared_experts.gate_proj.weight"] = weight(shared, h)
                w[p + "mlp.shared_experts.up_proj.weight"] = weight(shared, h)
                w[p + "mlp.shared_experts.down_proj.weight"] = weight(h, shared, scale=0.1)
    w["model.norm.weight"] = norm_weight(h)
    w["lm_head.weight"] = weight(V, h)
    for i in range(L, L + D):  # the MTP modules' own tensors, and the copies of the embedding and head they carry
        p = f"model.layers.{i}."
        w[p + "enorm.weight"], w[p + "hnorm.weight"] = norm_weight(h), norm_weight(h)
        w[p + "eh_proj.weight"] = weight(h, 2 * h, scale=0.2)
        w[p + "shared_head.norm.weight"] = norm_weight(h)
        w[p + "embed_tokens.weight"] = w["model.embed_tokens.weight"].clone()
        w[p + "shared_head.head.weight"] = w["lm_head.weight"].clone()
    return w


def interleaved(x):
    """rope_interleave: each pair of dims (2j, 2j + 1) to (j, j + d/2), as apply_rotary_pos_emb_interleave does."""
    *lead, d = x.shape
    return x.reshape(*lead, d // 2, 2).transpose(-1, -2).reshape(*lead, d)


def rope_tables(c, n, yarn_scaled):
    """cos and sin over the RoPE dims at positions 0..n-1 (YaRN's frequencies, times its attention factor), and the
    attention's softmax scale."""
    d, theta, scaling = c["qk_rope_head_dim"], c["rope_theta"], c.get("rope_scaling")
    inv, attention = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)), 1.0
    scale = (c["qk_nope_head_dim"] + d) ** -0.5
    if scaling:
        factor = scaling["factor"]
        inv, _ = yarn_scaled(inv, scaling, d, theta, c["max_position_embeddings"])
        if scaling.get("attention_factor") is not None:
            attention = scaling["attention_factor"]
        elif scaling.get("mscale") and scaling.get("mscale_all_dim"):
            attention = get_mscale(factor, scaling["mscale"]) / get_mscale(factor, scaling["mscale_all_dim"])
        else:
            attention = get_mscale(factor)
        if scaling.get("mscale_all_dim"):
            scale *= get_mscale(factor, scaling["mscale_all_dim"]) ** 2
    ang = torch.outer(torch.arange(n, dtype=torch.float64), inv)
    cos = (torch.cat((ang, ang), -1).cos() * attention).float()
    sin = (torch.cat((ang, ang), -1).sin() * attention).float()
    return cos, sin, scale


def swiglu(x, w, p):
    return (torch.nn.functional.silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ \
        w[p + "down_proj.weight"].T


def moe(c, w, p, m):
    """noaux_tc: the experts chosen on sigmoid scores plus the correction bias, within the best groups; weighted by
    the scores, normalised and scaled; plus the shared experts."""
    E, G, k = c["n_routed_experts"], c["n_group"], c["num_experts_per_tok"]
    scores = torch.sigmoid(m @ w[p + "mlp.gate.weight"].T)
    choice = scores + w[p + "mlp.gate.e_score_correction_bias"]
    groups = choice.view(-1, G, E // G).topk(2, -1)[0].sum(-1)
    best = groups.topk(c["topk_group"], -1)[1]
    keep = torch.zeros_like(groups).scatter(1, best, 1.0).bool().unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
    chosen = choice.masked_fill(~keep, float("-inf")).topk(k, -1)[1]
    weights = scores.gather(1, chosen)
    if c["norm_topk_prob"]:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    weights = weights * c["routed_scaling_factor"]
    out = torch.zeros_like(m)
    for j in range(k):
        for e in range(E):
            rows = chosen[:, j] == e
            if rows.any():
                out[rows] += weights[rows, j:j + 1] * swiglu(m[rows], w, p + f"mlp.experts.{e}.")
    if c["n_shared_experts"]:
        out = out + swiglu(m, w, p + "mlp.shared_experts.")
    return out


def layer(c, w, i, x, cos, sin, scale, mask):
    """Decoder layer i (or an MTP module's, numbered after them) on x [n, h]."""
    p, eps = f"model.layers.{i}.", c["rms_norm_eps"]
    n, H = x.shape[0], c["num_attention_heads"]
    nope, rope, v, rkv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
    if c["q_lora_rank"]:
        q = rms_norm(a @ w[p + "self_attn.q_a_proj.weight"].T, w[p + "self_attn.q_a_layernorm.weight"], eps)
        q = q @ w[p + "self_attn.q_b_proj.weight"].T
    else:
        q = a @ w[p + "self_attn.q_proj.weight"].T
    q_pass, q_rot = q.view(n, H, nope + rope).transpose(0, 1).split([nope, rope], -1)
    k_latent, k_rot = (a @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T).split([rkv, rope], -1)
    kv = rms_norm(k_latent, w[p + "self_attn.kv_a_layernorm.weight"], eps) @ w[p + "self_attn.kv_b_proj.weight"].T
    k_pass, value = kv.view(n, H, nope + v).transpose(0, 1).split([nope, v], -1)
    q_rot, k_rot = interleaved(q_rot), interleaved(k_rot.view(1, n, rope))
    q_rot, k_rot = q_rot * cos + rotate_half(q_rot) * sin, k_rot * cos + rotate_half(k_rot) * sin
    query = torch.cat((q_pass, q_rot), -1)
    key = torch.cat((k_pass, k_rot.expand(H, n, rope)), -1)
    att = torch.softmax(query @ key.transpose(1, 2) * scale + mask, -1)
    x = x + (att @ value).transpose(0, 1).reshape(n, H * v) @ w[p + "self_attn.o_proj.weight"].T
    m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
    return x + (swiglu(m, w, p + "mlp.") if i < c["first_k_dense_replace"] else moe(c, w, p, m))


def deepseek_v3_losses(c, w, tokens, yarn_scaled):
    """The main loss (mean cross-entropy of tokens[1:]) and the MTP modules' mean loss (0 without modules)."""
    inputs, targets = tokens[:-1], tokens[1:]
    n, eps, L = len(inputs), c["rms_norm_eps"], c["num_hidden_layers"]
    cos, sin, scale = rope_tables(c, n, yarn_scaled)
    mask = torch.full((n, n), float("-inf")).triu(1)
    x = w["model.embed_tokens.weight"][inputs]
    for i in range(L):
        x = layer(c, w, i, x, cos, sin, scale, mask)
    hidden = rms_norm(x, w["model.norm.weight"], eps)
    main = torch.nn.functional.cross_entropy(hidden @ w["lm_head.weight"].T, targets).item()
    D, mtp = c.get("num_nextn_predict_layers", 0), 0.0
    for k in range(1, D + 1):
        p = f"model.layers.{L + k - 1}."
        ahead = torch.cat((inputs[k:], torch.zeros(k, dtype=inputs.dtype)))  # token t + k, none past the end
        e = rms_norm(w[p + "embed_tokens.weight"][ahead], w[p + "enorm.weight"], eps)
        x = torch.cat((e, rms_norm(hidden, w[p + "hnorm.weight"], eps)), -1) @ w[p + "eh_proj.weight"].T
        hidden = rms_norm(layer(c, w, L + k - 1, x, cos, sin, scale, mask), w[p + "shared_head.norm.weight"], eps)
        logits = hidden @ w[p + "shared_head.head.weight"].T
        losses = torch.nn.functional.cross_entropy(logits[:n - k], targets[k:], reduction="sum")
        mtp += losses.item() / n / D
    return main, mtp


# DeepSeek-V3's config.json as DeepSeek's is written (its fields, small sizes): q latent 24, kv latent 16, heads 16 + 8
# RoPE dims wide and v 12, YaRN over 16 original positions with mscale and mscale_all_dim, the first layer dense, 8
# experts of 16 in 4 groups (top 4 from the best 2) beside one shared, and one MTP module.
DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_nextn_predict_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 8, "ep_size": 1,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "v_head_dim": 12,
    "qk_nope_head_dim": 16, "topk_method": "noaux_tc", "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4,
    "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": True, "scoring_func": "sigmoid",
    "aux_loss_alpha": 0.001, "seq_aux": True, "hidden_act": "silu", "max_position_embeddings": 64,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "bos_token_id": 0, "eos_token_id": 1,
    "tie_word_embeddings": False, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 16, "type": "yarn"},
    "attention_bias": False, "attention_dropout": 0.0, "torch_dtype": "float32", "transformers_version": "4.33.1"}
