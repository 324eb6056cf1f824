"""The Vision Transformer's encoder: image embeddings (:mod:`qkv.nn.patches`), then the same stack of
transformer layers a text encoder has.

Legend: B batch, K channels, T tokens ([CLS] + N patches), C model width, H heads.

Everything after the embeddings is the text encoder's: :class:`~qkv.nn.layer.TransformerLayer` s
with any similarity, norm, position slot and backend, a final norm (pre-LN), an optional pooler.
Its output is an :class:`~qkv.nn.encoder.EncoderOutput`. Every image of a batch has the same size,
so nothing is padded and no mask is formed.
"""

from __future__ import annotations

from torch import Tensor, nn

from qkv.nn.encoder import EncoderOutput, run_layers
from qkv.nn.patches import ImageEmbeddings

__all__ = ["VisionEncoder"]


class VisionEncoder(nn.Module):
    """Image embeddings, ``n_layers`` transformer layers, an optional final norm and pooler.

    Args:
        embeddings: an :class:`~qkv.nn.patches.ImageEmbeddings`.
        layers: the transformer layers.
        final_norm: applied to the last layer's output (pre-LN stacks), or ``None``.
        qk_positions: module ``length -> (T,C)`` added to every layer's query and key inputs only,
            or ``None``.
        pooler: module ``(B,T,C) -> (B,C)`` (ViT's ``tanh(dense(h[:, 0]))``), or ``None``.
        config: the :class:`~qkv.config.ModelConfig` it was built from (``.config``), or ``None``.
    """

    def __init__(self, embeddings: ImageEmbeddings, layers: list[nn.Module], *, final_norm: nn.Module | None = None,
                 qk_positions: nn.Module | None = None, pooler: nn.Module | None = None, config=None):
        super().__init__()
        self.config = config
        self.embeddings = embeddings
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        self.qk_positions = qk_positions
        self.pooler = pooler

    @property
    def prefix(self) -> int:
        """Tokens before the patches (1 with a [CLS] token)."""
        return self.embeddings.prefix

    def forward(self, pixel_values: Tensor, output_hidden_states: bool = False,
                output_attentions: bool = False) -> EncoderOutput:
        """Encode a batch of images.

        Args:
            pixel_values: ``(B,K,R,W)`` images (``(B,K,L)`` signals) of the model's size.
            output_hidden_states: also return the embedding output and every layer's output.
            output_attentions: also return every layer's exact ``(B,H,T,T)`` attention weights.

        Returns:
            :class:`~qkv.nn.encoder.EncoderOutput` (``last_hidden_state (B,T,C)``).

        Raises:
            ValueError: images of another shape, channel count or dtype (one line naming the expected).
        """
        x = self.embeddings(pixel_values)  # (B,K,…) -> (B,T,C)
        qk_pos = self.qk_positions(x.shape[1]) if self.qk_positions is not None else None  # (T,C)
        return run_layers(self, x, None, qk_pos, output_hidden_states, output_attentions)
