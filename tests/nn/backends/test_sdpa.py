"""The fused backend's kernel dtype: a CPU bf16 call that will be differentiated runs torch's kernel in
float32 (its bf16 backward is slow on CPU) and returns bf16; others run as given."""

import torch
import torch.nn.functional as F

from qkv.nn.backends.sdpa import _kernel_dtype


def _qkv(dtype, grad):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, 7, 8, generator=g).to(dtype).requires_grad_(grad) for _ in range(3)]


def _sdpa(q, k, v, **kwargs):
    """What the backend does around the kernel (see :func:`_kernel_dtype`)."""
    q, k, v, back, ctx = _kernel_dtype(q, k, v)
    with ctx:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    return out if back is None else out.to(back)


def test_a_differentiated_bf16_call_runs_in_float32_and_returns_bf16():
    q, k, v = _qkv(torch.bfloat16, True)
    qf, kf, vf, back, _ = _kernel_dtype(q, k, v)
    assert (qf.dtype, kf.dtype, vf.dtype, back) == (torch.float32,) * 3 + (torch.bfloat16,)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _sdpa(q, k, v, is_causal=True)
    assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    # reference: the same float32 computation, written out (softmax of scaled scores, causal)
    q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    scores = q32 @ k32.transpose(-1, -2) / 8 ** 0.5  # (B,H,T,S)
    scores = scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.softmax(scores, -1) @ v32
    torch.testing.assert_close(out.float(), ref.to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2)
    ref.to(torch.bfloat16).float().square().sum().backward()
    for mine, theirs in ((q, q32), (k, k32), (v, v32)):
        torch.testing.assert_close(mine.grad.float(), theirs.grad, atol=2e-2, rtol=2e-2)


def test_inference_and_float32_calls_run_as_given():
    for dtype, grad in ((torch.bfloat16, False), (torch.float32, True)):
        q, k, v = _qkv(dtype, grad)
        assert _kernel_dtype(q, k, v)[3] is None
        torch.testing.assert_close(_sdpa(q, k, v), F.scaled_dot_product_attention(q, k, v))
