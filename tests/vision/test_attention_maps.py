"""Attention over an image: rollout and mean attention distance against loops written from their
definitions; the encoder's exact weights read from an image model; a text model is refused in one line."""

import numpy as np
import pytest
import torch

from qkv.config_image import ImageConfig
from qkv.models.heads import TaskConfig
from qkv.models.vision_builders import build_image_classifier
from qkv.vision.attention_maps import (encoder_of_image, image_attentions, mean_attention_distance, patch_centres,
                                       rollout, to_grid)
from qkv.vision.config import model_config


def _weights(rng, *shape):
    w = rng.random(shape)
    return w / w.sum(-1, keepdims=True)


def test_rollout_matches_the_product_written_out():
    rng = np.random.default_rng(0)
    att = _weights(rng, 3, 2, 5, 5)  # (L,H,T,T)
    expected = np.eye(5)
    for layer in range(3):
        a = np.zeros((5, 5))
        for h in range(2):
            a += att[layer, h] / 2
        a = (a + np.eye(5)) / 2
        a = a / a.sum(1, keepdims=True)
        expected = a @ expected
    np.testing.assert_allclose(rollout(att), expected, rtol=1e-12)
    np.testing.assert_allclose(rollout(att).sum(-1), 1.0)


def test_mean_attention_distance_matches_a_loop_over_patches():
    image = ImageConfig(size=(6, 9), channels=1, patch=3, cls_token=True)  # grid 2×3, prefix 1
    assert image.grid == (2, 3) and image.prefix == 1
    rng = np.random.default_rng(1)
    att = _weights(rng, 2, 1, 2, 7, 7)  # (B,L,H,T,T)
    centres = [(1 + 3 * r, 1 + 3 * c) for r in range(2) for c in range(3)]
    np.testing.assert_allclose(patch_centres(image), centres)
    total = 0.0
    for b in range(2):
        for q in range(6):
            w = att[b, 0, 1, 1 + q, 1:]
            w = w / w.sum()
            total += sum(w[k] * np.hypot(centres[q][0] - centres[k][0], centres[q][1] - centres[k][1])
                         for k in range(6))
    got = mean_attention_distance(att, image)
    assert got.shape == (1, 2)
    assert got[0, 1] == pytest.approx(total / 12)


def test_a_head_looking_only_at_itself_has_distance_zero():
    image = ImageConfig(size=(4, 4), channels=1, patch=2, cls_token=False)
    att = np.broadcast_to(np.eye(4), (1, 1, 1, 4, 4))
    assert mean_attention_distance(att, image)[0, 0] == 0.0
    np.testing.assert_array_equal(to_grid(np.arange(4.0), image), [[0, 1], [2, 3]])


def test_image_attentions_reads_the_models_exact_weights():
    torch.manual_seed(0)
    config = model_config("vit-digits", {"image": {"patch": 2}}, n_heads=2, n_layers=3)
    model = build_image_classifier(config, TaskConfig("sequence-classification", ("a", "b", "c")))
    x = torch.randn(5, 1, 8, 8)
    att = image_attentions(model, x)
    T = config.image.n_tokens
    assert att.shape == (5, 3, 2, T, T) and model.training
    np.testing.assert_allclose(att.sum(-1), 1.0, rtol=1e-5)
    assert mean_attention_distance(att, config.image).shape == (3, 2)


def test_a_text_model_is_refused_in_one_line():
    with pytest.raises(ValueError, match="not an image model") as e:
        encoder_of_image(torch.nn.Linear(2, 2))
    assert "\n" not in str(e.value)
