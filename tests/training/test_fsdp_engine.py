"""The ``fsdp`` strategy in one process: its settings, its sharded checkpoints (written through
``torch.distributed.checkpoint`` without a process group) with a bit-identical resume, damaged or
misfitting checkpoints refused, the batch that keeps a run's global batch on another world size, and
the unsharded model the final folder is written from. The multi-process runs: ``test_fsdp.py``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest
import torch

from qkv.config import ModelConfig
from qkv.errors import CheckpointError, QkvError
from qkv.models.builders import build_causal_lm, build_masked_lm
from qkv.training.config import LoopConfig, TrainConfig
from qkv.training.distributed import DistInfo, per_process_batch
from qkv.training.engine import run_training
from qkv.training.lifecycle import open_run
from qkv.training.sharding import plain_model, shard_model
from qkv.training.strategy import make_strategy


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # (B,T)
    attention_mask: torch.Tensor  # (B,T)
    labels: torch.Tensor  # (B,T)


class LeftNeighbour:
    """Label every token with the token to its left (a pure function of the batch index)."""

    def batch(self, index: int) -> Batch:
        g = torch.Generator().manual_seed(index)
        ids = torch.randint(1, 16, (5, 7), generator=g)
        labels = torch.full_like(ids, -100)
        labels[:, 1:] = ids[:, :-1]
        return Batch(ids, torch.ones_like(ids, dtype=torch.bool), labels)

    def loss(self, model, b: Batch) -> torch.Tensor:
        return model(b.input_ids, b.attention_mask, labels=b.labels).loss


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_masked_lm(ModelConfig.from_flat(vocab_size=16, max_len=10, d_model=24, n_heads=3, d_ff=40,
                                                 n_layers=2, type_vocab_size=0, dropout=0.0))


def test_the_strategy_is_one_of_ddp_and_fsdp():
    assert LoopConfig(steps=1).strategy == "ddp"
    with pytest.raises(ValueError, match="strategy='zero'.*ddp, fsdp"):
        LoopConfig(steps=1, strategy="zero")
    with pytest.raises(ValueError, match="strategy"):
        TrainConfig(corpus=("dataset:pydoc",), out="r", strategy="deepspeed")
    assert TrainConfig.from_dict({"corpus": "dataset:pydoc", "out": "r"}).strategy == "ddp"  # runs before it
    with pytest.raises(ValueError, match="allowed: ddp, fsdp"):
        make_strategy("zero", DistInfo(0, 1, 0, torch.device("cpu")))


def _crash_at(step_no):
    def hook(step, model):
        if step == step_no:
            raise RuntimeError("the machine went away")
    return hook


def test_a_world_of_one_writes_sharded_checkpoints_and_resumes_bit_for_bit(tmp_path):
    loop = LoopConfig(steps=9, lr=3e-3, save_every=4, strategy="fsdp")
    whole = _model()
    run_training(loop, LeftNeighbour(), model=whole)
    with pytest.raises(RuntimeError), open_run(tmp_path / "run", resume=False) as run:
        run.create({"train_config": {}})
        run_training(loop, LeftNeighbour(), model=_model(), run=run, on_backward=_crash_at(7))
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000004"
    state = json.loads((ckpt / "trainer.json").read_text())
    assert (state["format"], state["world_size"], state["strategy"]) == ("sharded", 1, "fsdp")
    assert sorted(state["files"]) == [".metadata", "__0_0.distcp"]
    with open_run(tmp_path / "run", resume=True) as run:
        resumed = _model()
        assert run_training(loop, LeftNeighbour(), model=resumed, run=run).status == "complete"
    for (k, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k


def _run_until_crash(tmp_path, strategy: str):
    loop = LoopConfig(steps=6, save_every=2, strategy=strategy)
    with pytest.raises(RuntimeError), open_run(tmp_path / "run", resume=False) as run:
        run.create({"train_config": {}})
        run_training(loop, LeftNeighbour(), model=_model(), run=run, on_backward=_crash_at(3))
    return loop, tmp_path / "run" / "checkpoints" / "step-00000002"


def test_a_damaged_shard_is_refused_with_its_name(tmp_path):
    loop, ckpt = _run_until_crash(tmp_path, "fsdp")
    shard = ckpt / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp differs from the file written at save time"):
        with open_run(tmp_path / "run", resume=True) as run:
            run_training(loop, LeftNeighbour(), model=_model(), run=run)


def test_a_sharded_checkpoint_of_another_model_is_refused(tmp_path):
    loop, _ = _run_until_crash(tmp_path, "fsdp")
    torch.manual_seed(0)
    other = build_masked_lm(ModelConfig.from_flat(vocab_size=16, max_len=10, d_model=48, n_heads=3, d_ff=40,
                                                  n_layers=2, type_vocab_size=0, dropout=0.0))
    with pytest.raises(CheckpointError, match="does not fit this model and optimiser"):
        with open_run(tmp_path / "run", resume=True) as run:
            run_training(loop, LeftNeighbour(), model=other, run=run)


def test_fsdp_refuses_the_whole_model_checkpoint_of_a_ddp_run(tmp_path):
    loop, _ = _run_until_crash(tmp_path, "ddp")
    with pytest.raises(CheckpointError, match="written by a --strategy ddp run; continue it with --strategy ddp"):
        with open_run(tmp_path / "run", resume=True) as run:
            run_training(dataclasses.replace(loop, strategy="fsdp"), LeftNeighbour(), model=_model(),
                         run=run)


def test_the_global_batch_is_kept_on_another_number_of_processes():
    assert per_process_batch(4, 2, 1) == 8
    assert per_process_batch(8, 1, 4) == 2
    assert per_process_batch(6, 2, 3) == 4
    with pytest.raises(ValueError, match=r"global batch is 8 \(4 per process × 2\).*on 1, 2, 4, 8 processes"):
        per_process_batch(4, 2, 3)


def test_only_qkv_models_are_sharded():
    with pytest.raises(QkvError, match="--strategy fsdp trains qkv models only.*use --strategy ddp"):
        shard_model(torch.nn.Linear(3, 1), DistInfo(0, 2, 0, torch.device("cpu")))


@pytest.mark.parametrize("build", [build_masked_lm, build_causal_lm])
def test_the_final_model_is_rebuilt_unsharded_from_the_gathered_weights(build):
    torch.manual_seed(0)
    model = build(ModelConfig.from_flat(vocab_size=16, max_len=10, d_model=24, n_heads=3, d_ff=40, n_layers=2,
                                        type_vocab_size=0, dropout=0.0))
    plain = plain_model(model, {k: v.clone() for k, v in model.state_dict().items()})
    assert type(plain) is type(model) and plain is not model
    b = LeftNeighbour().batch(0)
    torch.testing.assert_close(plain(b.input_ids, b.attention_mask).logits,
                               model(b.input_ids, b.attention_mask).logits, atol=0, rtol=0)


def test_ddp_continues_a_sharded_checkpoint(tmp_path):
    loop = LoopConfig(steps=6, save_every=2, strategy="fsdp")
    whole = _model()
    run_training(loop, LeftNeighbour(), model=whole)
    _run_until_crash(tmp_path, "fsdp")
    with open_run(tmp_path / "run", resume=True) as run:
        resumed = _model()
        assert run_training(dataclasses.replace(loop, strategy="ddp"), LeftNeighbour(), model=resumed,
                            run=run).status == "complete"
    for (k, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k
