"""ViT in and out: qkv.load of transformers' ViTModel and ViTForImageClassification folders (random,
perturbed weights, distinct sizes, rectangular images, grey and colour) gives transformers' outputs
to 1e-5; the round trip back (export_hf → from_pretrained: the same tensors), qkv convert, the
names of transformers ≥ 5, and every refusal in one line."""

import json

import pytest
import torch
from families_support import perturb

import qkv
from qkv.checkpoints.convert import convert
from qkv.errors import CheckpointError
from qkv.models.vision import ImageClassifier
from qkv.nn.vision_encoder import VisionEncoder

transformers = pytest.importorskip("transformers")

# distinct sizes: C 24, H 3, F 40, 2 layers, a 12×8 image of 3 channels in 4×4 patches (6 patches + [CLS]), L 5
SIZES = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40, image_size=[12, 8],
             patch_size=4, num_channels=3, hidden_act="gelu", layer_norm_eps=1e-12)


def _folder(tmp_path, cls="ViTModel", name="vit", **overrides):
    torch.manual_seed(0)
    config = transformers.ViTConfig(**{**SIZES, **overrides})
    hf = perturb(getattr(transformers, cls)(config))
    hf.save_pretrained(tmp_path / name)
    return hf, tmp_path / name


def _pixels(channels=3, size=(12, 8)):
    return torch.randn(5, channels, *size, generator=torch.Generator().manual_seed(1))


def test_vit_model_matches_transformers(tmp_path):
    hf, folder = _folder(tmp_path)
    model = qkv.load(folder).model
    assert isinstance(model, VisionEncoder)
    cfg = model.config
    assert (cfg.family, cfg.norm.placement, cfg.d_model, cfg.ffn.d_ff, cfg.image.size, cfg.image.n_tokens) == (
        "vit", "pre", 24, 40, (12, 8), 7)
    x = _pixels()
    with torch.no_grad():
        theirs, ours = hf(x), model(x)
    torch.testing.assert_close(ours.last_hidden_state, theirs.last_hidden_state, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.pooler_output, theirs.pooler_output, atol=1e-5, rtol=0)


def test_vit_for_image_classification_matches_transformers_grey(tmp_path):
    labels = {"0": "shirt", "1": "bag", "2": "boot", "3": "dress", "4": "coat"}
    hf, folder = _folder(tmp_path, "ViTForImageClassification", num_channels=1, image_size=[8, 12], patch_size=[4, 2],
                         id2label=labels, label2id={v: int(k) for k, v in labels.items()})
    model = qkv.load(folder).model
    assert isinstance(model, ImageClassifier) and model.task.labels == tuple(labels.values())
    assert model.task.pooling == "cls" and model.config.image.grid == (2, 6)
    x = _pixels(1, (8, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, hf(x).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cls", ["ViTModel", "ViTForImageClassification"])
def test_round_trip_back_to_transformers(tmp_path, cls):
    hf, folder = _folder(tmp_path, cls, num_labels=5)
    model = qkv.load(folder).model
    qkv.export_hf(model, tmp_path / "back")
    again = getattr(transformers, cls).from_pretrained(tmp_path / "back").eval()
    want = hf.state_dict()
    for name, t in again.state_dict().items():
        torch.testing.assert_close(t, want[name], atol=0, rtol=0, msg=name)
    x = _pixels()
    with torch.no_grad():
        a, b = again(x), hf(x)
    out = "logits" if cls != "ViTModel" else "last_hidden_state"
    torch.testing.assert_close(getattr(a, out), getattr(b, out))


def test_convert_to_a_qkv_folder_and_back(tmp_path):
    hf, folder = _folder(tmp_path, "ViTForImageClassification", num_labels=5)
    convert(folder, tmp_path / "q")
    assert json.loads((tmp_path / "q" / "qkv.json").read_text())["kind"] == "image_classification"
    x = _pixels()
    with torch.no_grad():
        torch.testing.assert_close(qkv.load(tmp_path / "q").model(x).logits, hf(x).logits, atol=1e-5, rtol=0)


def test_transformers_5_module_names_are_read(tmp_path):
    from safetensors.torch import load_file, save_file

    hf, folder = _folder(tmp_path)
    renamed = {k.replace("encoder.layer.", "layers.").replace("attention.attention.query", "attention.q_proj")
               .replace("attention.attention.key", "attention.k_proj").replace("attention.attention.value", "attention.v_proj")
               .replace("attention.output.dense", "attention.o_proj").replace("intermediate.dense", "mlp.fc1")
               .replace("output.dense", "mlp.fc2"): v for k, v in load_file(folder / "model.safetensors").items()}
    save_file(renamed, str(folder / "model.safetensors"))
    x = _pixels()
    with torch.no_grad():
        torch.testing.assert_close(qkv.load(folder).model(x).last_hidden_state, hf(x).last_hidden_state, atol=1e-5,
                                   rtol=0)


def _edit(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes,msg", [
    (dict(qkv_bias=False), "qkv_bias=False is not supported"),
    (dict(architectures=["ViTForMaskedImageModeling"]), "masked-image-modelling decoder is not supported"),
    (dict(image_size=[13, 8]), "not divisible by patch_size"),
    (dict(pooler_act="relu"), "pooler_act='relu'"),
    (dict(num_hidden_layers=1), "unexpected tensor 'encoder.layer.1"),
    (dict(problem_type="multi_label_classification", architectures=["ViTForImageClassification"]),
     "multi_label_classification"),
])
def test_refusals_are_one_line(tmp_path, changes, msg):
    _, folder = _folder(tmp_path)
    _edit(folder, **changes)
    with pytest.raises(CheckpointError, match=msg) as e:
        qkv.load(folder)
    assert "\n" not in str(e.value)


def test_export_refuses_what_vit_cannot_express(tmp_path):
    from qkv.config import ModelConfig
    from qkv.models.heads import TaskConfig
    from qkv.models.vision_builders import build_image_classifier

    cfg = ModelConfig.from_flat(vocab_size=1, pad_token_id=None, type_vocab_size=0, d_model=24, n_heads=3, d_ff=40,
                                n_layers=1, max_len=8, norm="post", image=dict(size=[8, 8], patch=4, stride=2,
                                                                                position="rope-2d", cls_token=True,
                                                                                stem=[4]))
    model = build_image_classifier(cfg, TaskConfig("sequence-classification", ("a", "b"), pooling="mean"))
    with pytest.raises(CheckpointError) as e:
        qkv.export_hf(model, tmp_path / "x")
    for what in ("norm.placement='post'", "image.stride=(2, 2)", "image.position='rope-2d'", "pooling='mean'",
                 "image.stem=[4]"):
        assert what in str(e.value)
    assert not (tmp_path / "x").exists()
