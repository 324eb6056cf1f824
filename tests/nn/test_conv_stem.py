"""The convolutional stem against a NumPy reference: each 3×3 (or 3-wide) convolution computed by
hand as a sum over the zero-padded neighbourhood and input channels, GELU through ``math.erf``; the
patch embedding with a stem equals the hand-cut patches of the reference feature maps times the
weight; the configuration's one-line refusals and its round trip through a dict."""

import math

import numpy as np
import pytest
import torch

from qkv.config_image import ImageConfig
from qkv.nn.conv_stem import ConvStem
from qkv.nn.patches import PatchEmbedding

from test_patches import _reference_patches

_gelu = np.vectorize(lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))


def _reference_conv2d(x, weight, bias):
    """``(B,K,R,W)`` → ``(B,K',R,W)``: out[b,o,i,j] = bias[o] + Σ_k Σ_a Σ_c w[o,k,a,c]·x[b,k,i+a-1,j+c-1]
    (pixels outside the image are 0)."""
    B, K, R, W = x.shape
    padded = np.zeros((B, K, R + 2, W + 2))
    padded[:, :, 1:-1, 1:-1] = x
    out = np.zeros((B, weight.shape[0], R, W))
    for o in range(weight.shape[0]):
        out[:, o] = bias[o]
        for k in range(K):
            for a in range(3):
                for c in range(3):
                    out[:, o] += weight[o, k, a, c] * padded[:, k, a:a + R, c:c + W]
    return out


def _reference_conv1d(x, weight, bias):
    B, K, L = x.shape
    padded = np.zeros((B, K, L + 2))
    padded[:, :, 1:-1] = x
    out = np.zeros((B, weight.shape[0], L))
    for o in range(weight.shape[0]):
        out[:, o] = bias[o]
        for k in range(K):
            for a in range(3):
                out[:, o] += weight[o, k, a] * padded[:, k, a:a + L]
    return out


def _reference_stem(stem, x, conv):
    for layer in stem.layers:
        if isinstance(layer, (torch.nn.Conv1d, torch.nn.Conv2d)):
            x = conv(x, layer.weight.detach().numpy(), layer.bias.detach().numpy())
        else:
            x = _gelu(x)
    return x


def test_a_two_convolution_stem_equals_the_hand_computed_one():
    torch.manual_seed(0)
    stem = ConvStem(3, (5, 4)).double()
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64)
    got = stem(x)
    assert got.shape == (2, 4, 7, 6)  # the image keeps its size
    np.testing.assert_allclose(got.detach().numpy(), _reference_stem(stem, x.numpy(), _reference_conv2d), atol=1e-12)


def test_a_stem_over_a_signal_is_three_wide():
    torch.manual_seed(1)
    stem = ConvStem(2, (3,), dims=1).double()
    x = torch.randn(4, 2, 12, dtype=torch.float64)
    np.testing.assert_allclose(stem(x).detach().numpy(), _reference_stem(stem, x.numpy(), _reference_conv1d),
                               atol=1e-12)


@pytest.mark.parametrize("patch,stride", [((4, 4), (4, 4)), ((4, 2), (2, 2))])
def test_patches_are_cut_from_the_stems_feature_maps(patch, stride):
    torch.manual_seed(2)
    emb = PatchEmbedding((8, 6), 1, patch, stride, 10, stem=(3, 2)).double()
    assert emb.proj.weight.shape == (10, 2 * math.prod(patch))  # F = K'·p·q: the stem's last channels
    x = torch.randn(3, 1, 8, 6, dtype=torch.float64)
    maps = _reference_stem(emb.stem, x.numpy(), _reference_conv2d)  # (B,K',R,W)
    want = _reference_patches(maps, patch, stride) @ emb.proj.weight.detach().numpy().T + emb.proj.bias.detach().numpy()
    np.testing.assert_allclose(emb(x).detach().numpy(), want, atol=1e-12)
    with pytest.raises(ValueError, match="1-channel 8×6 images"):  # the input is still checked first
        emb(torch.randn(3, 2, 8, 6, dtype=torch.float64))


def test_the_stem_in_the_config():
    image = ImageConfig(size=(28, 28), patch=7, stem=[16, 8])
    assert image.stem == (16, 8) and image.features == 8 and image.patch_dim == 8 * 49
    assert ImageConfig.from_dict(image.to_dict()) == image
    assert ImageConfig().stem == () and ImageConfig().patch_dim == 16
    assert ImageConfig.from_dict({k: v for k, v in image.to_dict().items() if k != "stem"}).stem == ()  # older folders


@pytest.mark.parametrize("bad", [[0], [16, -1], ["16"], [True], 16, [1, 2, 3, 4, 5], [2048]])
def test_a_bad_stem_is_one_line(bad):
    with pytest.raises(ValueError, match=r"image\.stem=.*at most 4 channel counts.*e\.g\. \[16, 16\]") as e:
        ImageConfig(stem=bad)
    assert "\n" not in str(e.value)
