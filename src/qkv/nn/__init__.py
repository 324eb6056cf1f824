"""Neural-network building blocks: similarities, masks, the attention core, layers, the pooler."""

from qkv.nn.attend import AttendOutput, attend
from qkv.nn.attention import AttentionOutput, MultiHeadAttention
from qkv.nn.embeddings import Embeddings
from qkv.nn.encoder import Encoder, EncoderOutput
from qkv.nn.layer import ACTIVATIONS, FeedForward, LayerOutput, TransformerLayer
from qkv.nn.pooler import Pooler
from qkv.nn.similarity import SIMILARITIES, build_similarity, register_similarity

__all__ = [
    "attend",
    "AttendOutput",
    "MultiHeadAttention",
    "AttentionOutput",
    "SIMILARITIES",
    "build_similarity",
    "register_similarity",
    "ACTIVATIONS",
    "FeedForward",
    "LayerOutput",
    "TransformerLayer",
    "Embeddings",
    "Encoder",
    "EncoderOutput",
    "Pooler",
]
