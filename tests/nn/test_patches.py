"""Patch embedding against a NumPy reference: the image cut into patches by hand (loops over rows,
columns and channels), each patch flattened and multiplied by the weight — side-by-side and
overlapping patches, grey and colour, 2-D images and 1-D signals; the [CLS] token and positions of
the image embeddings; one-line refusals of inputs of another shape."""

import numpy as np
import pytest
import torch

from qkv.config_image import ImageConfig
from qkv.nn.patches import ImageEmbeddings, PatchEmbedding, cut_patches


def _reference_patches(x, patch, stride):
    """``(B,K,R,W)`` → ``(B,N,K·p·q)`` by hand: patch (i, j) covers rows i·s … i·s+p-1 and columns
    j·t … j·t+q-1; its values in channel, row, column order; patches in reading order."""
    B, K, R, W = x.shape
    (p, q), (s, t) = patch, stride
    rows, cols = (R - p) // s + 1, (W - q) // t + 1
    out = np.zeros((B, rows * cols, K * p * q))
    for b in range(B):
        for i in range(rows):
            for j in range(cols):
                values = [x[b, k, i * s + a, j * t + c] for k in range(K) for a in range(p) for c in range(q)]
                out[b, i * cols + j] = values
    return out


@pytest.mark.parametrize("size,channels,patch,stride", [
    ((12, 8), 3, (4, 4), (4, 4)),      # colour, side by side (the reshape path)
    ((12, 10), 1, (3, 2), (3, 2)),     # grey, rectangular patches
    ((11, 9), 2, (5, 3), (3, 2)),      # overlapping (the unfold path)
])
def test_patch_embedding_equals_the_hand_cut_reference(size, channels, patch, stride):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, channels, *size, generator=g, dtype=torch.float64)
    emb = PatchEmbedding(size, channels, patch, stride, 24).double()
    want = _reference_patches(x.numpy(), patch, stride) @ emb.proj.weight.detach().numpy().T \
        + emb.proj.bias.detach().numpy()
    np.testing.assert_allclose(emb(x).detach().numpy(), want, atol=1e-12)
    assert ImageConfig(size=size, channels=channels, patch=patch, stride=stride).n_patches == want.shape[1]


def test_the_patch_map_is_the_convolution_with_kernel_patch_and_step_stride():
    x = torch.randn(2, 3, 11, 9, dtype=torch.float64)
    emb = PatchEmbedding((11, 9), 3, (5, 3), (3, 2), 16).double()
    conv = torch.nn.functional.conv2d(x, emb.proj.weight.reshape(16, 3, 5, 3), emb.proj.bias, stride=(3, 2))
    torch.testing.assert_close(emb(x), conv.flatten(2).transpose(1, 2))  # (B,C,rows,cols) -> (B,N,C)


def test_one_dimensional_patches_of_a_signal():
    x = torch.randn(4, 2, 40, dtype=torch.float64)
    got = cut_patches(x, (6,), (2,))  # (B,N,K·p)
    want = np.stack([[np.concatenate([x[b, k, n * 2:n * 2 + 6].numpy() for k in range(2)]) for n in range(18)]
                     for b in range(4)])
    np.testing.assert_array_equal(got.numpy(), want)
    assert ImageConfig(size=(40,), patch=6, stride=2).grid == (18,)


def test_image_embeddings_put_cls_first_and_add_positions():
    emb = ImageEmbeddings(PatchEmbedding((8, 8), 1, (4, 4), (4, 4), 12), 12, cls_token=True,
                          positions=lambda T: torch.arange(T, dtype=torch.float32)[:, None].expand(T, 12))
    with torch.no_grad():
        emb.cls.fill_(7.0)
    x = torch.randn(3, 1, 8, 8)
    out = emb(x)
    assert out.shape == (3, 5, 12)
    torch.testing.assert_close(out[:, 0], torch.full((3, 12), 7.0))
    torch.testing.assert_close(out[:, 1:], emb.patches(x) + torch.arange(1, 5.0)[:, None])


def test_a_picture_of_another_shape_is_one_line():
    emb = PatchEmbedding((28, 28), 1, (4, 4), (4, 4), 8)
    for bad, what in ((torch.randn(2, 3, 28, 28), r"got torch.float32 \(2, 3, 28, 28\)"),
                      (torch.randn(2, 1, 32, 32), "1-channel 28×28 images"),
                      (torch.zeros(2, 1, 28, 28, dtype=torch.uint8), "must be a float tensor")):
        with pytest.raises(ValueError, match=what) as e:
            emb(bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw,msg", [
    (dict(size=(28, 28), patch=5), r"does not tile the 28 pixels.*\(size − patch\) % stride = 3.*patch=4"),
    (dict(size=(28, 28), patch=4, stride=3), r"% stride = 0|does not tile"),
    (dict(size=(8, 8), patch=9), "larger than the 8×8 image"),
    (dict(size=(8, 8), patch=(2, 2, 2)), "one or two positive ints"),
    (dict(size=(40,), patch=(4, 4)), "has 2 dimension"),
])
def test_sizes_the_patch_does_not_tile_are_refused_in_one_line(kw, msg):
    if kw.get("stride") == 3:  # (28 - 4) % 3 == 0: this one tiles
        assert ImageConfig(**kw).grid == (9, 9)
        return
    with pytest.raises(ValueError, match=msg) as e:
        ImageConfig(**kw)
    assert "\n" not in str(e.value)
