"""Model footprints counted on the meta device (equal to the real model's counts) and the refusal of a
model that cannot fit, before anything is allocated."""

from __future__ import annotations

import pytest
import torch

from qkv.config import ModelConfig
from qkv.models.builders import build_causal_lm, build_encoder_decoder, build_masked_lm
from qkv.models.footprint import ModelTooLargeError, available_memory, check_fits, footprint


@pytest.mark.parametrize("build,position", [(build_masked_lm, "learned"), (build_masked_lm, "sinusoidal"),
                                            (build_causal_lm, "rope"), (build_encoder_decoder, "learned")])
def test_footprint_counts_what_the_real_model_holds(build, position):
    cfg = ModelConfig.preset("tiny", position=position)
    real = build(cfg)
    fp = footprint(lambda: build(cfg))
    assert fp.parameters == sum(p.numel() for p in real.parameters())
    assert fp.buffers == sum(b.numel() for b in real.buffers())
    name, t = max([*real.named_parameters(), *real.named_buffers()], key=lambda x: x[1].numel())
    assert (fp.largest, fp.largest_shape) == (name, tuple(t.shape))
    assert fp.bytes("training") == 16 * fp.parameters + 4 * fp.buffers


def test_a_model_that_cannot_fit_is_refused_before_allocation():
    cfg = ModelConfig.preset("tiny", max_len=100_000_000)  # a 100M-row position table: 2.4 billion parameters
    with pytest.raises(ModelTooLargeError, match=r"the model needs 35\.8 GiB for training \(2,400,\d{3},\d{3} "
                                                 r"parameters; the largest tensor is encoder\.embeddings\.positions"
                                                 r"\.weight, 100000000 × 24\) but this machine has 1\.0 GiB free; "
                                                 r"choose less"):
        check_fits(lambda: build_masked_lm(cfg), available=2**30, hint="choose less")
    small = ModelConfig.preset("tiny")
    assert check_fits(lambda: build_masked_lm(small), use="inference", available=2**30).parameters > 0
    free = available_memory()
    assert free is None or free > 0


def test_the_command_line_names_an_allocation_failure_as_out_of_memory():
    from qkv.cli import describe_error

    exc = RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you "
                       "tried to allocate 25600000512 bytes. Error code 12 (Cannot allocate memory)")
    msg = describe_error(exc)
    assert msg.startswith("out of memory (") and "25600000512 bytes" in msg and "--batch-size" in msg
    assert "unexpected" not in msg and "Error code" not in msg
    assert describe_error(MemoryError()).startswith("out of memory (MemoryError)")
