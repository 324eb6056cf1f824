"""qkv on a GPU: parity of every CUDA path with the CPU, which SDPA kernel runs, and timings.

    python benchmarks/gpu_check.py                      # on a machine with a CUDA GPU
    python benchmarks/gpu_check.py --json gpu.json      # the figures as JSON too
    python benchmarks/gpu_check.py --device cpu --quick # the script itself, checked on the CPU

Parity (each against the same computation on the CPU in float32):

* attention: every built-in backend that runs on the device (``sdpa``, ``explicit``, ``chunked``)
  on a padded batch, in float32 and in bfloat16;
* SDPA's fused kernels: a causal call without a mask under ``FLASH_ATTENTION`` only, a padded call
  under ``EFFICIENT_ATTENTION`` only (bf16) — torch refuses a call its kernel cannot run, so passing
  means that kernel is the one chosen;
* a masked LM's forward pass (fp32, and bf16 autocast), five training steps of the engine (fp32 and
  bf16 autocast, batches moved through pinned memory), and ``qkv.embed`` of a model folder.

Timings (medians after warm-up, CUDA synchronised): attention forward at T = 512 and 2048 (sdpa and
explicit, fp32 and bf16), training steps per second of the ``mini`` masked LM (fp32 and bf16), and
documents per second of ``qkv.embed`` — each beside the CPU's where it is quick to measure.

Without a CUDA device it says so and exits 0: nothing is checked.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

TOL_FP32 = 1e-4  # GPU float32 (TF32 off) against CPU float32
TOL_BF16 = 3e-2  # bfloat16: 8 bits of mantissa


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="the device checked against the CPU (default cuda)")
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (a check of the script)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    return p


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_s(fn, device: torch.device, reps: int) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass
class Report:
    rows: list
    failures: list

    def check(self, name: str, diff: float, tol: float) -> None:
        ok = diff <= tol
        self.rows.append({"check": name, "max_abs_diff": diff, "tolerance": tol, "ok": ok})
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: max |Δ| {diff:.2e} (tolerance {tol:.0e})", flush=True)
        if not ok:
            self.failures.append(name)

    def kernel(self, name: str, fn) -> None:
        try:
            fn()
            ok, why = True, ""
        except RuntimeError as e:
            ok, why = False, (str(e).splitlines() or [""])[0][:160]
        self.rows.append({"check": name, "ok": ok, **({"error": why} if why else {})})
        print(f"  {'ok  ' if ok else 'FAIL'} {name}" + (f": {why}" if why else ""), flush=True)
        if not ok:
            self.failures.append(name)


def check_attention(device: torch.device, report: Report, quick: bool) -> None:
    from qkv.nn.attend import attend
    from qkv.nn.similarity import build_similarity

    g = torch.Generator().manual_seed(0)
    b, h, t, d = (2, 3, 37, 16) if quick else (4, 8, 257, 64)
    q, k, v = (torch.randn(b, h, t, d, generator=g) for _ in range(3))
    mask = torch.ones(b, 1, 1, t, dtype=torch.bool)
    mask[0, ..., t // 2:] = False  # a padded row
    sim = build_similarity("scaled_dot", n_heads=h, d_head=d)
    want = attend(q, k, v, similarity=sim, mask=mask, backend="explicit").output  # (B,H,T,D) CPU fp32
    for backend in ("sdpa", "explicit", "chunked"):
        for dtype, tol in ((torch.float32, TOL_FP32), (torch.bfloat16, TOL_BF16)):
            got = attend(*(x.to(device, dtype) for x in (q, k, v)), similarity=sim, mask=mask.to(device),
                         backend=backend).output
            report.check(f"attention {backend} {str(dtype)[6:]}", (got.float().cpu() - want).abs().max().item(), tol)
    if device.type != "cuda":
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qb, kb, vb = (x.to(device, torch.bfloat16) for x in (q, k, v))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        report.kernel("sdpa: flash kernel for a causal call without mask (bf16)",
                      lambda: attend(qb, kb, vb, similarity=sim, causal=True, backend="sdpa"))
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        report.kernel("sdpa: memory-efficient kernel for a padded call (bf16)",
                      lambda: attend(qb, kb, vb, similarity=sim, mask=mask.to(device), backend="sdpa"))


def _tiny_config(quick: bool):
    from qkv.config import ModelConfig

    if quick:
        return ModelConfig.from_flat(vocab_size=97, max_len=32, d_model=24, n_heads=3, d_ff=40, n_layers=2,
                                     type_vocab_size=0, dropout=0.0)
    return ModelConfig.preset("mini", vocab_size=8192, max_len=128, dropout=0.0)


class _Objective:
    """Masked-token batches of random ids (a pure function of the index)."""

    def __init__(self, vocab: int, batch: int, length: int):
        self.vocab, self.shape = vocab, (batch, length)

    def batch(self, index: int):
        from qkv.data.pipeline import MLMBatch

        g = torch.Generator().manual_seed(index)
        ids = torch.randint(5, self.vocab, self.shape, generator=g)
        labels = torch.where(torch.rand(self.shape, generator=g) < 0.15, ids, torch.full_like(ids, -100))
        labels[:, 0] = ids[:, 0]
        mask = torch.ones(self.shape, dtype=torch.bool)
        zero = torch.zeros(self.shape[0], dtype=torch.long)
        return MLMBatch(ids.masked_fill(labels != -100, 4), mask, labels, zero, zero)

    def units(self, b):
        return (b.labels != -100).sum()

    def loss(self, model, b):
        return model(b.input_ids, b.attention_mask, labels=b.labels).loss


def check_model(device: torch.device, report: Report, quick: bool) -> dict:
    from qkv.models.builders import build_masked_lm
    from qkv.training.config import LoopConfig
    from qkv.training.engine import run_training
    from qkv.training.precision import autocast

    cfg = _tiny_config(quick)
    obj = _Objective(cfg.vocab_size, 4 if quick else 32, 16 if quick else 128)
    torch.manual_seed(0)
    cpu = build_masked_lm(cfg).eval()
    dev = build_masked_lm(cfg).to(device).eval()
    dev.load_state_dict(cpu.state_dict())
    b = obj.batch(0)
    with torch.no_grad():
        want = cpu(b.input_ids, b.attention_mask).logits
        got = dev(b.input_ids.to(device), b.attention_mask.to(device)).logits
        report.check("masked LM forward fp32", (got.cpu() - want).abs().max().item(), TOL_FP32 * 10)
        with autocast("bf16", device):
            got = dev(b.input_ids.to(device), b.attention_mask.to(device)).logits
        rel = ((got.float().cpu() - want).abs().max() / want.abs().max()).item()
        report.check("masked LM forward bf16 autocast (relative)", rel, TOL_BF16)
    steps = 5
    losses = {}
    for name, where, precision in (("cpu fp32", torch.device("cpu"), "fp32"), ("fp32", device, "fp32"),
                                   ("bf16", device, "bf16")):
        torch.manual_seed(0)
        model = build_masked_lm(cfg)
        info = _info(where)
        r = run_training(LoopConfig(steps=steps, lr=1e-3, log_every=1), obj, model=model, info=info,
                         precision=precision)
        losses[name] = [row["loss"] for row in r.history]
    report.check("training: 5 steps fp32 (losses)", max(abs(a - c) for a, c in zip(losses["fp32"], losses["cpu fp32"])),
                 TOL_FP32 * 10)
    report.check("training: 5 steps bf16 autocast (losses, relative)",
                 max(abs(a - c) / abs(c) for a, c in zip(losses["bf16"], losses["cpu fp32"])), TOL_BF16)
    return {"config": "tiny" if quick else "mini", "batch": obj.shape}


def _info(device: torch.device):
    from qkv.training.distributed import DistInfo

    return DistInfo(0, 1, 0, device)


def check_embed(device: torch.device, report: Report, quick: bool, folder: Path) -> None:
    import numpy as np

    from qkv.embeddings.embedder import embed

    texts = _texts(40 if quick else 400)
    want = embed(folder, texts, device="cpu", max_len=32)
    got = embed(folder, texts, device=str(device), max_len=32)
    report.check("qkv.embed vectors (fp32)", float(np.abs(got - want).max()), TOL_FP32 * 10)


def _texts(n: int) -> list[str]:
    from pydoc_data.topics import topics

    paras = [p for t in topics.values() for p in t.split("\n\n") if len(p.split()) > 5]
    return [paras[i % len(paras)] for i in range(n)]


def _model_folder(root: Path, quick: bool) -> Path:
    from qkv.checkpoints.io import save
    from qkv.data.tokenizer import train_tokenizer
    from qkv.models.builders import build_encoder

    tok = train_tokenizer(_texts(400), vocab_size=400 if quick else 4000, max_chars=300_000)
    torch.manual_seed(0)
    cfg = _tiny_config(quick).replace(vocab_size=tok.vocab_size)
    save(build_encoder(cfg), root / "model", tokenizer=tok.backend)
    return root / "model"


def timings(device: torch.device, quick: bool, folder: Path) -> list[dict]:
    from qkv.embeddings.embedder import Embedder
    from qkv.models.builders import build_masked_lm
    from qkv.nn.attend import attend
    from qkv.nn.similarity import build_similarity
    from qkv.training.optim import build_optimizer
    from qkv.training.precision import autocast

    rows, reps = [], 3 if quick else 20
    sizes = (64,) if quick else (512, 2048)
    h, d = (3, 16) if quick else (12, 64)
    sim = build_similarity("scaled_dot", n_heads=h, d_head=d)
    for t in sizes:
        for dtype in (torch.float32, torch.bfloat16):
            q = torch.randn(4, h, t, d, device=device, dtype=dtype)
            for backend in ("sdpa", "explicit"):
                s = _median_s(lambda: attend(q, q, q, similarity=sim, backend=backend), device, reps)
                rows.append({"timing": f"attention forward T={t} {backend} {str(dtype)[6:]}", "ms": s * 1e3})
    cfg = _tiny_config(quick)
    obj = _Objective(cfg.vocab_size, 4 if quick else 32, 16 if quick else 128)
    b = obj.batch(0)
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = build_masked_lm(cfg).to(device).train()
        opt = build_optimizer(model, lr=1e-4, weight_decay=0.01)
        batch = b.to(device)

        def step():
            with autocast(precision, device):
                loss = model(batch.input_ids, batch.attention_mask, labels=batch.labels).loss
            opt.zero_grad(set_to_none=True)
            loss.float().backward()
            opt.step()

        s = _median_s(step, device, reps)
        rows.append({"timing": f"training step {'tiny' if quick else 'mini'} batch {obj.shape} {precision}",
                     "ms": s * 1e3, "steps_per_s": 1 / s})
    texts = _texts(40 if quick else 2000)
    for where in ("cpu", str(device)) if device.type == "cuda" else (str(device),):
        e = Embedder(folder, max_len=32 if quick else 128, device=where)
        s = _median_s(lambda: e.embed(texts), torch.device(where), 1 if quick else 3)
        rows.append({"timing": f"qkv.embed {len(texts)} documents on {where}", "docs_per_s": len(texts) / s})
    for r in rows:
        print("  " + r["timing"] + ": " + ", ".join(f"{k} {v:,.2f}" for k, v in r.items() if k != "timing"))
    return rows


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA device: torch {torch.__version__} sees none (torch.cuda.is_available() is False); "
              "nothing checked — run this on a machine with a GPU")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 parity: no TF32 in matrix products
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    print(f"{name} ({device}); torch {torch.__version__}; {time.strftime('%Y-%m-%d')}", flush=True)
    report = Report([], [])
    with tempfile.TemporaryDirectory() as tmp:
        folder = _model_folder(Path(tmp), a.quick)
        print("parity with the CPU:")
        check_attention(device, report, a.quick)
        check_model(device, report, a.quick)
        check_embed(device, report, a.quick, folder)
        print("timings:")
        rows = timings(device, a.quick, folder)
    result = {"device": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "checks": report.rows,
              "timings": rows, "failures": report.failures}
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))
    print(f"{len(report.rows) - len(report.failures)} of {len(report.rows)} checks passed"
          + (f"; failed: {', '.join(report.failures)}" if report.failures else ""))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
