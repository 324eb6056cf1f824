"""The loop settings checked once for every run configuration that holds them, the fields of the
recipe runs, and each configuration's tokens per example in the batch limit (stated by every run
configuration: a subclass of RunConfig without it cannot be instantiated)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from qkv.config import ModelConfig
from qkv.embeddings.contrastive_config import ContrastiveConfig
from qkv.finetune.config import FinetuneConfig
from qkv.lab.encoder_config import EncoderTaskConfig
from qkv.lab.seq2seq import Seq2SeqRunConfig
from qkv.training.config import RunConfig, TrainConfig
from qkv.training.loop_fields import RecipeLoopFields
from qkv.translation.train import TranslationRunConfig
from qkv.validation import MAX_BATCH_TOKENS
from qkv.vision.caption_config import CaptionTrainConfig, caption_model_config
from qkv.vision.config import ImageTrainConfig, model_config

_CONFIGS = {
    "pretrain": lambda **kw: TrainConfig(corpus=("c.txt",), out="o", **kw),
    "finetune": lambda **kw: FinetuneConfig(model="m", task="sequence-classification", train=("t.jsonl",), out="o",
                                            **kw),
    "image": lambda **kw: ImageTrainConfig(out="o", preset="vit-digits", **kw),
    "caption": lambda **kw: CaptionTrainConfig(out="o", preset="caption-tiny", **kw),
}


@pytest.mark.parametrize("kind", list(_CONFIGS))
@pytest.mark.parametrize("bad, message", [
    ({"lr": 0.0}, "lr=0.0 must be > 0"),
    ({"clip_norm": -1.0}, "clip_norm=-1.0 must be > 0"),
    ({"weight_decay": -0.5}, "weight_decay=-0.5 must be ≥ 0"),
    ({"warmup_steps": -1}, "warmup_steps=-1 must be an int ≥ 0"),
    ({"grad_accum": 0}, "grad_accum=0 must be an int ≥ 1"),
    ({"log_every": 0}, "log_every=0 must be an int ≥ 1"),
    ({"schedule": "zigzag"}, "schedule"),
    ({"time_budget": -2.0}, "time_budget"),
])
def test_every_run_config_refuses_a_bad_loop_setting_with_one_message(kind, bad, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        _CONFIGS[kind](**bad)


def test_the_recipe_runs_share_the_loop_fields_and_keep_their_own_first():
    for cls in (ImageTrainConfig, CaptionTrainConfig):
        assert issubclass(cls, RecipeLoopFields)
        names = [f.name for f in dataclasses.fields(cls)]
        assert {f.name for f in dataclasses.fields(RecipeLoopFields)} <= set(names)
        assert cls("o").out == "o"  # ``out`` is still the one positional field
    image = ImageTrainConfig(out="o", preset="vit-digits").resolved()
    assert (image.batch_size, image.lr, image.steps, image.schedule) == (64, 5e-3, 300, "cosine")  # the recipe's
    assert ImageTrainConfig(out="o", preset="vit-digits", steps=7).resolved().steps == 7


def test_an_earlier_run_json_still_loads_in_any_key_order():
    cfg = CaptionTrainConfig(out="run", preset="caption-tiny", lr=1e-3, eval_sample=9)
    stored = dict(reversed(list(cfg.to_dict().items())))  # as run.json of the flat field list held them
    assert CaptionTrainConfig.from_dict(stored) == cfg
    image = ImageTrainConfig(out="run", augment=("flip",), steps=5)
    assert ImageTrainConfig.from_dict(dict(reversed(list(image.to_dict().items())))) == image


def test_tokens_per_example_counts_patches_cls_and_the_caption_window():
    # vit-digits: 8×8 pictures in patches of 4 → 2×2 patches, +1 for [CLS]
    assert _CONFIGS["image"]().tokens_per_example() == 2 * 2 + 1
    sized = model_config("vit-digits", {"image": {"patch": 2}})  # 4×4 patches
    assert _CONFIGS["image"]().tokens_per_example(sized) == 4 * 4 + 1
    # caption-tiny: 16×16 canvases in patches of 8 → 2×2, +1 for [CLS], and the 24-token caption window
    assert _CONFIGS["caption"]().tokens_per_example() == 2 * 2 + 1 + 24
    wide = caption_model_config("caption-tiny", 9, (32, 32), 1)  # 4×4 patches
    assert _CONFIGS["caption"]().tokens_per_example(wide) == 4 * 4 + 1 + 24
    assert _CONFIGS["pretrain"](max_len=64).tokens_per_example() == 64


def test_the_batch_limit_counts_each_runs_tokens_per_example():
    over = MAX_BATCH_TOKENS // 5 + 1
    with pytest.raises(ValueError, match=f"batch_size={over:,} × tokens per image=5 "):
        _CONFIGS["image"](batch_size=over)
    _CONFIGS["image"](batch_size=MAX_BATCH_TOKENS // 5)
    with pytest.raises(ValueError, match="eval_batch_size=.* × tokens per canvas and caption=29 "):
        _CONFIGS["caption"](eval_batch_size=MAX_BATCH_TOKENS // 29 + 1)
    with pytest.raises(ValueError, match=r"batch_size=.* × max_len=128 .*smaller batch_size or max_len"):
        _CONFIGS["pretrain"](batch_size=MAX_BATCH_TOKENS // 128 + 1)


def test_a_run_config_must_state_its_tokens_per_example():
    @dataclasses.dataclass(frozen=True)
    class Silent(RunConfig):
        steps: int = 1

        def to_dict(self):
            return dataclasses.asdict(self)

    with pytest.raises(TypeError, match="abstract.*tokens_per_example"):
        Silent()

    @dataclasses.dataclass(frozen=True)
    class Stated(Silent):
        def tokens_per_example(self, model=None):
            return 7

    cfg = Stated()  # a frozen dataclass on the abstract base: built, replaced, frozen
    assert cfg.tokens_per_example() == 7 and cfg.replace(steps=2).steps == 2
    assert cfg.diff(cfg.replace(steps=2)) == ["steps: 1 → 2"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.steps = 3


def test_every_run_config_of_the_package_states_its_tokens_per_example():
    def subclasses(cls):
        return {cls} | {s for sub in cls.__subclasses__() for s in subclasses(sub)}

    ours = {c for c in subclasses(RunConfig) - {RunConfig} if c.__module__.startswith("qkv.")}
    assert ours >= {TrainConfig, FinetuneConfig, ImageTrainConfig, CaptionTrainConfig, ContrastiveConfig,
                    EncoderTaskConfig, Seq2SeqRunConfig, TranslationRunConfig}
    assert sorted(c.__name__ for c in ours if inspect.isabstract(c)) == []
    assert ContrastiveConfig(max_len=40).tokens_per_example() == 40
    assert EncoderTaskConfig().tokens_per_example() is None  # sized for the task's rows later
    assert EncoderTaskConfig().tokens_per_example(ModelConfig.preset("tiny", max_len=33)) == 33
