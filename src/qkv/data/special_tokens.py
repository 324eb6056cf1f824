"""The special tokens of a tokenizer, by role, read from the tokenizer's own configuration.

A role (:data:`ROLES`) is what a token is for: ``cls`` (the first token of a model input: BERT's
``[CLS]``, RoBERTa's ``<s>``), ``sep`` (the last: ``[SEP]``, ``</s>``), ``pad``, ``mask``, ``unk``,
``bos``, ``eos``. Where each comes from, first found wins:

1. what the model folder declares: ``tokenizer_config.json`` and ``special_tokens_map.json``
   (``cls_token``, ``sep_token``, ``pad_token``, ``mask_token``, ``unk_token``, ``bos_token``,
   ``eos_token``; :func:`read_declared`);
2. the tokenizer itself: its post-processor (the template of one and of two texts, e.g.
   ``[CLS] $A [SEP]`` or RoBERTa's ``<s> $A </s></s> $B </s>``, found by running it), its padding
   setting (``pad``) and its model's unknown token (``unk``);
3. for the roles still open (``cls`` / ``sep`` only when there is no post-processor): the
   tokenizer's tokens under the names the families give them (:data:`CONVENTIONS`).

The template is what qkv puts around every window: ``prefix`` before the text, ``suffix`` after
it, ``pair_middle`` between two texts — so a BERT window is ``[CLS] … [SEP]``, a RoBERTa one
``<s> … </s>``, and a tokenizer without a post-processor (GPT-2's) adds nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

__all__ = ["ROLES", "CONVENTIONS", "Specials", "resolve_specials", "read_declared"]

#: The roles special tokens play.
ROLES = ("cls", "sep", "pad", "mask", "unk", "bos", "eos")
#: The names the families give each role's token, looked for among the tokenizer's own tokens when
#: neither the folder nor the tokenizer's settings say (BERT / ModernBERT, RoBERTa / BART / XLM-R /
#: T5, GPT-2).
CONVENTIONS = {
    "cls": ("[CLS]", "<s>"),
    "sep": ("[SEP]", "</s>"),
    "pad": ("[PAD]", "<pad>", "<|pad|>", "<|padding|>"),
    "mask": ("[MASK]", "<mask>", "<|mask|>"),
    "unk": ("[UNK]", "<unk>", "<|unk|>"),
    "bos": ("<s>", "<bos>", "[BOS]", "[CLS]"),  # GPT-2 starts a prompt with no token
    "eos": ("</s>", "<eos>", "[EOS]", "<|endoftext|>", "[SEP]"),
}
#: The files of a model folder that declare special tokens, in the order read (later ones win).
DECLARING_FILES = ("special_tokens_map.json", "tokenizer_config.json")
_KEYS = {f"{role}_token": role for role in ROLES}


def read_declared(folder: str | os.PathLike | None) -> dict[str, str]:
    """The special tokens a model folder declares, by role (see the module docstring); ``{}`` for
    ``None`` or a folder that declares none. A file that is not a JSON object declares nothing (the
    tokenizer reader reports damaged files)."""
    out: dict[str, str] = {}
    if folder is None:
        return out
    for name in DECLARING_FILES:
        path = Path(folder) / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        for key, role in _KEYS.items():
            value = data.get(key)
            if isinstance(value, dict):  # {"content": "<s>", "lstrip": …}
                value = value.get("content")
            if isinstance(value, str) and value:
                out[role] = value
    return out


@dataclass(frozen=True)
class Specials:
    """The special tokens of one tokenizer (see the module docstring).

    Attributes:
        tokens: role → token text, for the roles the tokenizer has.
        ids: role → id, likewise.
        prefix, suffix: ids put before and after one text (``(cls,)`` and ``(sep,)`` for BERT).
        pair_middle, pair_suffix: ids between two texts and after the second.
        pair_type: the segment id of the second text and what follows it (1 for BERT, 0 for RoBERTa).
        all_ids: every special token's id (the roles' and the tokenizer's own special tokens).
        declared: the roles the model folder declared (empty when it declared none).
    """

    tokens: Mapping[str, str]
    ids: Mapping[str, int]
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    pair_middle: tuple[int, ...] = ()
    pair_suffix: tuple[int, ...] = ()
    pair_type: int = 0
    all_ids: frozenset[int] = frozenset()
    declared: Mapping[str, str] = field(default_factory=dict)

    def id(self, role: str) -> int | None:
        """The id of ``role``'s token, ``None`` when the tokenizer has none."""
        return self.ids.get(role)

    def token(self, role: str) -> str | None:
        """The text of ``role``'s token, ``None`` when the tokenizer has none."""
        return self.tokens.get(role)

    def missing(self, roles: Sequence[str]) -> list[str]:
        """The roles of ``roles`` the tokenizer has no token for."""
        return [r for r in roles if r not in self.ids]

    def describe(self) -> str:
        """One line: ``cls=[CLS] sep=[SEP] pad=[PAD] …`` (the roles present)."""
        return " ".join(f"{r}={self.tokens[r]}" for r in ROLES if r in self.tokens) or "no special tokens"


def _template(backend: Tokenizer) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    """``(prefix, suffix, pair_middle, pair_suffix, pair_type)``: the ids the post-processor adds
    around one text and two texts, and the segment id of the second text, found by running it on
    probe encodings."""
    if backend.post_processor is None:
        return (), (), (), (), 0
    if backend.padding or backend.truncation:  # probe a copy: the caller's tokenizer keeps its settings
        backend = Tokenizer.from_str(backend.to_str())
        backend.no_padding()
        backend.no_truncation()
    a = backend.encode("a", add_special_tokens=False)
    b = backend.encode("b", add_special_tokens=False)
    if not a.ids or not b.ids:  # a tokenizer that drops these letters: nothing to place around
        return (), (), (), (), 0

    def split(enc) -> list[list[int]]:
        """The runs of added tokens between the texts' tokens (``special_tokens_mask`` 1)."""
        runs: list[list[int]] = [[]]
        for i, added in zip(enc.ids, enc.special_tokens_mask):
            if added:
                runs[-1].append(i)
            elif len(runs) == 1 or runs[-1]:
                runs.append([])
        return runs

    one = split(backend.post_process(a, None, True))
    pair = backend.post_process(a, b, True)
    two = split(pair)
    prefix, suffix = tuple(one[0]), tuple(one[-1]) if len(one) > 1 else ()
    middle = tuple(two[1]) if len(two) > 2 else ()
    second = [t for t, added in zip(pair.type_ids, pair.special_tokens_mask) if not added][len(a.ids):]
    pair_type = second[0] if second else 0
    return prefix, suffix, middle, tuple(two[-1]) if len(two) > 2 else (), int(pair_type)


def _special_tokens(backend: Tokenizer) -> dict[str, int]:
    return {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}


def resolve_specials(backend: Tokenizer, declared: Mapping[str, str] | None = None) -> Specials:
    """The :class:`Specials` of ``backend`` (a ``tokenizers.Tokenizer``); ``declared``: role → token
    the model folder declares (:func:`read_declared`). A declared token the vocabulary lacks is
    ignored (the tokenizer's own settings then decide)."""
    prefix, suffix, middle, pair_suffix, pair_type = _template(backend)
    ids: dict[str, int] = {}
    tokens: dict[str, str] = {}

    def put(role: str, token: str | None) -> None:
        if role in ids or not token:
            return
        i = backend.token_to_id(token)
        if i is not None:
            ids[role], tokens[role] = i, token

    declared = dict(declared or {})
    for role, token in declared.items():
        if role in ROLES:
            put(role, token)
    if prefix:
        put("cls", backend.id_to_token(prefix[0]))
    if suffix:
        put("sep", backend.id_to_token(suffix[-1]))
    padding = backend.padding
    if padding:
        put("pad", padding.get("pad_token"))
    put("unk", getattr(backend.model, "unk_token", None))
    for role in ROLES:
        if role in ("cls", "sep") and backend.post_processor is not None:
            continue  # the template decides; a tokenizer without one in its template adds none
        for name in CONVENTIONS[role]:
            put(role, name)
    if not prefix and not suffix and backend.post_processor is None and "cls" in ids and "sep" in ids:
        prefix, suffix = (ids["cls"],), (ids["sep"],)  # a BERT vocabulary without a post-processor
        middle, pair_suffix, pair_type = (ids["sep"],), (ids["sep"],), 1
    put("bos", tokens.get("cls"))
    put("eos", tokens.get("sep"))
    all_ids = frozenset(_special_tokens(backend).values()) | frozenset(ids.values()) | frozenset(prefix + suffix + middle)
    return Specials(tokens, ids, prefix, suffix, middle, pair_suffix, pair_type, all_ids,
                    {r: t for r, t in declared.items() if r in ids and tokens[r] == t})
