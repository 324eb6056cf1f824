"""Shared constants and helpers of the analysis tests (a uniquely named module, importable from tests)."""

from __future__ import annotations

# Distinct sizes so that a transposed axis fails: 3 layers, 4 heads, width 24, FFN 40, 40 positions.
N_LAYERS, N_HEADS, D_MODEL, MAX_LEN = 3, 4, 24, 40


def pydoc_texts(n: int) -> list[str]:
    """The first ``n`` pydoc topics (English prose from the standard library)."""
    from pydoc_data.topics import topics

    return [topics[k].strip() for k in sorted(topics)][:n]


def qkv_load_unavailable() -> str | None:
    """``None`` when ``qkv.load`` imports, else the reason it does not (for a skip)."""
    try:
        import qkv

        _ = qkv.load  # triggers the lazy import
    except (ImportError, AttributeError) as exc:
        return f"qkv.load is not importable yet: {exc}"
    return None
