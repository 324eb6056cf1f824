"""The CUDA paths of training and embedding, against the CPU. Skipped without a GPU (this says so);
``benchmarks/gpu_check.py`` runs the wider parity checks and the timings on one."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_masked_lm
from qkv.training.config import LoopConfig
from qkv.training.distributed import DistInfo, resolve_device
from qkv.training.engine import run_training
from qkv.training.objective import move_batch

NO_GPU = "no CUDA device (torch.cuda.is_available() is False): the CUDA paths are not checked here"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # (B,T)
    attention_mask: torch.Tensor  # (B,T)
    labels: torch.Tensor  # (B,T)


class LeftNeighbour:
    def batch(self, index: int) -> Batch:
        g = torch.Generator().manual_seed(index)
        ids = torch.randint(1, 16, (5, 7), generator=g)
        labels = torch.full_like(ids, -100)
        labels[:, 1:] = ids[:, :-1]
        return Batch(ids, torch.ones_like(ids, dtype=torch.bool), labels)

    def loss(self, model, b: Batch) -> torch.Tensor:
        return model(b.input_ids, b.attention_mask, labels=b.labels).loss


def _model():
    torch.manual_seed(0)
    return build_masked_lm(ModelConfig.from_flat(vocab_size=16, max_len=10, d_model=24, n_heads=3, d_ff=40,
                                                 n_layers=2, type_vocab_size=0, dropout=0.0))


def test_cuda_without_a_gpu_is_refused_with_the_fix():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="--device cuda was asked for, but torch sees no CUDA device; use cpu or auto"):
        resolve_device("cuda")


@cuda
def test_batches_reach_the_gpu_through_pinned_memory():
    b = move_batch(LeftNeighbour().batch(0), torch.device("cuda"))
    assert b.input_ids.is_cuda and torch.equal(b.input_ids.cpu(), LeftNeighbour().batch(0).input_ids)


@cuda
@pytest.mark.parametrize("precision, tol", [("fp32", 1e-4), ("bf16", 3e-2)])
def test_training_on_the_gpu_follows_the_cpu(precision, tol):
    torch.backends.cuda.matmul.allow_tf32 = False
    loop = LoopConfig(steps=8, lr=3e-3, log_every=1)
    cpu = run_training(loop, LeftNeighbour(), model=_model())
    gpu = run_training(loop, LeftNeighbour(), model=_model(), info=DistInfo(0, 1, 0, torch.device("cuda", 0)),
                       precision=precision)
    for a, b in zip(cpu.history, gpu.history):
        assert abs(a["loss"] - b["loss"]) <= tol * abs(a["loss"]), (a, b)


@cuda
def test_embedding_on_the_gpu_equals_the_cpu(tiny_model, pydoc_texts):
    import numpy as np

    from qkv.embeddings.embedder import embed

    texts = [t[:500] for t in pydoc_texts[:30]]
    np.testing.assert_allclose(embed(tiny_model, texts, device="cuda"), embed(tiny_model, texts, device="cpu"),
                               atol=1e-4, rtol=0)
