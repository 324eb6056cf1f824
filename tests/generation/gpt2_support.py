"""A transformers GPT2LMHeadModel with random weights and a qkv CausalLM with the same weights
(copied by hand: GPT-2's c_attn / c_proj / c_fc are Conv1D, weight transposed against nn.Linear)."""

from __future__ import annotations

import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_causal_lm


def gpt2_pair(*, vocab=101, d_model=32, n_heads=4, n_layers=2, n_positions=64, seed=0):
    """``(hf_model, qkv_model)``, both in eval mode, float32."""
    transformers = __import__("pytest").importorskip("transformers")
    torch.manual_seed(seed)
    hf_cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=d_model, n_head=n_heads, n_layer=n_layers,
                                     n_positions=n_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    cfg = ModelConfig.from_flat(vocab_size=vocab, d_model=d_model, n_heads=n_heads, d_ff=4 * d_model, n_layers=n_layers,
                      max_len=n_positions, norm="pre", activation="gelu_tanh", layer_norm_eps=1e-5,
                      type_vocab_size=0, embedding_norm=False, pad_token_id=None, position="learned", dropout=0.0)
    model = build_causal_lm(cfg).eval()
    return hf, copy_gpt2_weights(hf, model)


def copy_gpt2_weights(hf, model):
    """Copy a GPT2LMHeadModel's weights into a qkv CausalLM of the same shape."""
    src = hf.transformer
    dec = model.decoder
    with torch.no_grad():
        dec.embeddings.tokens.weight.copy_(src.wte.weight)
        dec.embeddings.positions.weight.copy_(src.wpe.weight)
        for block, layer in zip(src.h, dec.layers):
            att = layer.attention
            att.qkv_proj.weight.copy_(block.attn.c_attn.weight.t())  # Conv1D (C,3C) -> Linear (3C,C)
            att.qkv_proj.bias.copy_(block.attn.c_attn.bias)
            att.out_proj.weight.copy_(block.attn.c_proj.weight.t())
            att.out_proj.bias.copy_(block.attn.c_proj.bias)
            layer.feed_forward.linear1.weight.copy_(block.mlp.c_fc.weight.t())
            layer.feed_forward.linear1.bias.copy_(block.mlp.c_fc.bias)
            layer.feed_forward.linear2.weight.copy_(block.mlp.c_proj.weight.t())
            layer.feed_forward.linear2.bias.copy_(block.mlp.c_proj.bias)
            for mine, theirs in ((layer.norm1, block.ln_1), (layer.norm2, block.ln_2)):
                mine.weight.copy_(theirs.weight)
                mine.bias.copy_(theirs.bias)
        dec.final_norm.weight.copy_(src.ln_f.weight)
        dec.final_norm.bias.copy_(src.ln_f.bias)
    return model
