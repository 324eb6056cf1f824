"""Model folders written by the code before the nested config load and give the same outputs."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import qkv

FIXTURES = Path(__file__).parent.parent / "fixtures" / "v1_folders"
FOLDERS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def test_every_kind_is_covered():
    kinds = {__import__("json").loads((FIXTURES / f / "qkv.json").read_text())["kind"] for f in FOLDERS}
    assert kinds == {"encoder", "masked_lm", "causal_lm", "encoder_decoder", "discriminator",
                     "sequence_classification", "token_classification"}


@pytest.mark.parametrize("name", FOLDERS)
def test_old_folder_loads_with_same_outputs(name):
    inputs = load_file(FIXTURES / "inputs.safetensors")
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    want = load_file(FIXTURES / name / "expected.safetensors")
    model = qkv.load(FIXTURES / name).model
    with torch.no_grad():
        if "generated" in want:  # an encoder–decoder
            tgt = torch.tensor([[1, 4, 6, 8], [1, 10, 12, 14]])
            torch.testing.assert_close(model(ids, mask, decoder_input_ids=tgt).logits, want["logits"],
                                       atol=1e-5, rtol=1e-5)
            assert torch.equal(model.generate(ids, mask, max_new_tokens=5), want["generated"])
            return
        out = model(ids, mask)
    for key, value in want.items():
        torch.testing.assert_close(getattr(out, key), value, atol=1e-5, rtol=1e-5, msg=f"{name}: {key}")
