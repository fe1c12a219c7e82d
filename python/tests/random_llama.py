"""A Llama of a given config.json with seeded random weights (normal, std 0.02; the
output head sharper), written as safetensors beside the config, so that vLLM loads
real weights instead of its dummy ones. vLLM's dummy init (uniform in +-1e-3) gives
near-uniform logits: a prompt's first or middle token, or its whole KV, can change
without changing the output, so "the same tokens with and without dpukv" proved
nothing on it. With these weights the output depends on the context, and each
test that compares tokens shows first that another prompt's KV changes them.

Every process that writes the same config and seed gets the same bytes."""
import json
import os

import torch


def write_random_llama(folder, config, seed=0, std=0.02, head_std=0.5):
    """config.json and model.safetensors for LlamaForCausalLM in folder."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    g = torch.Generator().manual_seed(seed)
    h, ffn, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kvh = config["num_attention_heads"], config["num_key_value_heads"]
    hd = h // heads

    def w(*shape, s=std):
        return (torch.randn(*shape, generator=g) * s).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": w(v, h), "model.norm.weight": torch.ones(h).bfloat16()}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(heads * hd, h),
                  p + "self_attn.k_proj.weight": w(kvh * hd, h),
                  p + "self_attn.v_proj.weight": w(kvh * hd, h),
                  p + "self_attn.o_proj.weight": w(h, heads * hd),
                  p + "mlp.gate_proj.weight": w(ffn, h),
                  p + "mlp.up_proj.weight": w(ffn, h),
                  p + "mlp.down_proj.weight": w(h, ffn),
                  p + "input_layernorm.weight": torch.ones(h).bfloat16(),
                  p + "post_attention_layernorm.weight": torch.ones(h).bfloat16()})
    if not config.get("tie_word_embeddings", False):
        t["lm_head.weight"] = w(v, h, s=head_std)
    save_file(t, os.path.join(folder, "model.safetensors"))
