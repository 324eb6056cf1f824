"""``qkv demo --attention``: the end-to-end showcase of the attention core (``qkv demo`` itself,
the pretraining demo, is :mod:`qkv.demo_pretrain`).

It walks the textbook's chapter in order and checks each claim with numbers:

1. the matrix form ``V·Softmax[KᵀQ]`` (NumPy, D×N columns) equals the per-token sum;
2. qkv's PyTorch ``MultiHeadAttention`` (float64) equals the NumPy multi-head reference;
3. it equals ``torch.nn.MultiheadAttention`` with the same weights (float32), padding included;
4. self-attention is permutation-equivariant: ``Sa[XP] = Sa[X]P``;
5. every similarity function agrees across the fused, explicit and query-chunked paths;
6. how the paths compare in time and in memory, at a length where it matters.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from qkv import reference
from qkv.models.builders import build_attention
from qkv.nn.attention import MultiHeadAttention
from qkv.nn.similarity import SIMILARITIES

__all__ = ["run_attention_demo"]


def _heads_from_module(mha: MultiHeadAttention) -> tuple[list[tuple[np.ndarray, ...]], np.ndarray]:
    """Slice the fused projection into the book's per-head (Ω_v, β_v, Ω_q, β_q, Ω_k, β_k)."""
    C, D = mha.d_model, mha.d_head
    W = mha.qkv_proj.weight.detach().double().numpy()  # (3C, C): rows q | k | v
    b = mha.qkv_proj.bias.detach().double().numpy()  # (3C,)
    heads = []
    for h in range(mha.n_heads):
        rows = slice(h * D, (h + 1) * D)
        q, k, v = (slice(o * C + rows.start, o * C + rows.stop) for o in range(3))
        heads.append((W[v], b[v, None], W[q], b[q, None], W[k], b[k, None]))  # maps (D,C), biases (D,1)
    return heads, mha.out_proj.weight.detach().double().numpy()


def _line(label: str, value: str) -> None:
    print(f"  {label:<58} {value}")


def run_attention_demo(seed: int = 0) -> dict[str, float]:
    """Run the showcase, print what it checks, and return the measured figures."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    figures: dict[str, float] = {}

    print("1. The textbook's self-attention in NumPy (X is D×N, one column per token)")
    D, N = 8, 5
    X = rng.standard_normal((D, N))
    maps = [rng.standard_normal(s) for s in ((D, D), (D, 1)) * 3]
    sa = reference.self_attention(X, *maps, scaled=True)
    loop = reference.self_attention_per_token(X, *maps, scaled=True)
    figures["matrix_vs_loop"] = float(np.abs(sa - loop).max())
    _line("max |V·Softmax[KᵀQ] − Σ_m a[x_m,x_n] v_m|", f"{figures['matrix_vs_loop']:.1e}")

    print("2. qkv MultiHeadAttention (float64) against the NumPy multi-head reference")
    C, H, T, B = 24, 3, 7, 5
    mha = build_attention(C, H).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    heads, omega_c = _heads_from_module(mha)
    b_out = mha.out_proj.bias.detach().double().numpy()[:, None]  # (C,1)
    ref = np.stack([(reference.multihead_self_attention(xb.numpy().T, heads, omega_c) + b_out).T for xb in x])
    with torch.no_grad():
        got = mha(x).output.numpy()
    figures["torch_vs_numpy"] = float(np.abs(got - ref).max())
    _line("max |qkv − reference| (B=5, T=7, C=24, H=3)", f"{figures['torch_vs_numpy']:.1e}")

    print("3. against torch.nn.MultiheadAttention with the same weights (float32, padded batch)")
    mha32 = build_attention(C, H)
    torch_mha = torch.nn.MultiheadAttention(C, H, batch_first=True)
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(mha32.qkv_proj.weight)
        torch_mha.in_proj_bias.copy_(mha32.qkv_proj.bias)
        torch_mha.out_proj.weight.copy_(mha32.out_proj.weight)
        torch_mha.out_proj.bias.copy_(mha32.out_proj.bias)
        x32 = torch.randn(B, T, C)
        lengths = torch.tensor([7, 6, 4, 2, 1])
        real = torch.arange(T)[None, :] < lengths[:, None]  # (B,T) True = real token
        ours = mha32(x32, real, need_weights=True)
        theirs, w = torch_mha(x32, x32, x32, key_padding_mask=~real, average_attn_weights=False)
    figures["vs_torch_output"] = float((ours.output - theirs).abs().max())
    figures["vs_torch_weights"] = float((ours.weights - w).abs().max())
    _line("max |output − torch|", f"{figures['vs_torch_output']:.1e}")
    _line("max |weights − torch|", f"{figures['vs_torch_weights']:.1e}")

    print("4. permutation equivariance: Sa[XP] = Sa[X]P")
    perm = torch.randperm(T)
    with torch.no_grad():
        figures["equivariance"] = float((mha(x[:, perm]).output - mha(x).output[:, perm]).abs().max())
    _line("max |Sa[XP] − Sa[X]P|", f"{figures['equivariance']:.1e}")

    print("5. every similarity on every path (float64, padded batch)")
    real64 = real.clone()
    for name in sorted(SIMILARITIES):
        m = build_attention(C, H, similarity=name).double()
        outs = {}
        with torch.no_grad():
            for path in ("sdpa", "explicit", "chunked"):
                if path == "sdpa" and not m.similarity.has_dot_form:
                    continue
                m.path, m.chunk_size = path, 3
                outs[path] = m(x, real64).output
        base = outs["explicit"]
        diff = max(float((o - base).abs().max()) for o in outs.values())
        figures[f"paths_{name}"] = diff
        _line(f"{name:<10} paths {'/'.join(outs)}: max difference", f"{diff:.1e}")

    print("6. the paths at length 2048 (B=1, H=8, C=512, forward, no grad)")
    big = build_attention(512, 8)
    xb = torch.randn(1, 2048, 512)
    for path, need in (("sdpa", False), ("explicit", True), ("chunked", True)):
        big.path = path
        with torch.no_grad():
            big(xb, need_weights=need)  # warm-up
            t0 = time.perf_counter()
            big(xb, need_weights=need)
            dt = time.perf_counter() - t0
        figures[f"time_{path}"] = dt
        what = "weights returned" if need else "no weights"
        _line(f"{path:<9} ({what})", f"{dt * 1e3:8.1f} ms")
    print("\nAll checks ran. Next: `make test` runs the full test suite.")
    return figures
