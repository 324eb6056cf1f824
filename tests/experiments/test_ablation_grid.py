"""Grid files: the built-in grids, validation errors that name the bad key, variant resolution."""

from __future__ import annotations

import json

import pytest

from qkv.experiments.cli import parse_set
from qkv.experiments.grid import Grid, builtin_grids, load_grid
from qkv.experiments.plan import resolve_variant, validate_grid

BUILTIN = ("heads", "modern", "norm", "positions", "projections", "scaling", "similarity")


def _grid(**changes) -> dict:
    data = {"name": "g", "question": "q?", "base": {"preset": "tiny"},
            "variants": {"a": {}, "b": {"model": {"norm": "pre"}}}}
    data.update(changes)
    return data


def test_builtin_grids_load_validate_and_ask_the_issue_questions():
    assert tuple(builtin_grids()) == BUILTIN
    for name in BUILTIN:
        grid = load_grid(name)
        assert grid.name == name and grid.question
        configs = validate_grid(grid, {"steps": 10})
        assert list(configs) == list(grid.variants)
        assert all(c.preset == "mini" for c in configs.values())
    assert load_grid("projections").stats == ("self_attention_share", "heads")
    assert load_grid("scaling").stats == ("saturation", "heads")
    assert all("heads" in load_grid(n).stats for n in BUILTIN if n != "modern")  # did the heads specialise?
    assert load_grid("positions").length_factor == 2
    assert len(load_grid("positions").variants) == 10
    positions = validate_grid(load_grid("positions"))
    assert positions["sinusoidal-scaled"].model["embed_scale"] and "embed_scale" not in positions["sinusoidal"].model
    heads = validate_grid(load_grid("heads"))
    assert [heads[v].model["n_heads"] for v in ("h1", "h2", "h4", "h8")] == [1, 2, 4, 8]
    sims = {c.model["similarity"] for c in validate_grid(load_grid("similarity")).values()}
    assert sims == {"dot", "scaled_dot", "bilinear", "additive", "cosine"}
    assert validate_grid(load_grid("norm"))["pre-rmsnorm"].model["norm_type"] == "rmsnorm"
    modern = validate_grid(load_grid("modern"))
    assert {v: (c.model.get("feed_forward"), c.model.get("activation")) for v, c in modern.items()
            if v.endswith("glu")} == {"geglu": ("glu", "gelu"), "swiglu": ("glu", "silu")}
    assert all(c.model["norm"] == "pre" for c in modern.values())


@pytest.mark.parametrize("change, words", [
    (dict(colour="red"), ["unknown key(s) ['colour']", "allowed: name, question"]),
    (dict(variants={}), ["variants must be a non-empty object"]),
    (dict(variants={"a": {"qkv_proj": False}}),
     ["unknown key 'qkv_proj'", 'put it under "model"', "allowed:"]),
    (dict(variants={"a": {"seed": 3}}), ["'seed' is set by the harness"]),
    (dict(variants={"a": {"vocab_size": 500}}), ["'vocab_size' decides the data", "base"]),
    (dict(variants={"a": {"model": {"heads": 2}}}), ["unknown model key 'heads'", "n_heads"]),
    (dict(base={"model": {"vocab_size": 50}}), ["model.vocab_size comes from the shared tokenizer"]),
    (dict(variants={"a/b": {}}), ["variant name 'a/b'"]),
    (dict(variants={"a": {"lr_scale": -1}}), ["lr_scale=-1 must be a positive number"]),
    (dict(base={"lr_scale": 2}), ["unknown key 'lr_scale'"]),
    (dict(stats=["entropy"]), ["stats=['entropy']", "self_attention_share, saturation"]),
    (dict(extra_eval={"length_factor": 1}), ["length_factor=1 must be an int ≥ 2"]),
    (dict(extra_eval={"lengths": 2}), ["unknown key(s) ['lengths']", "allowed: length_factor"]),
])
def test_bad_grids_name_the_key_and_the_allowed_ones(change, words):
    with pytest.raises(ValueError) as e:
        Grid.from_dict(_grid(**change), source="my.json")
    msg = str(e.value)
    assert msg.startswith("my.json"), msg
    for w in words:
        assert w in msg, (w, msg)


def test_grid_files_bad_json_unknown_names_and_bad_values(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",\n "question": }')
    with pytest.raises(ValueError, match=r"bad.json: not valid JSON: .* line 2"):
        load_grid(str(bad))
    with pytest.raises(ValueError, match="unknown grid 'nope'; built-in: heads, modern, norm, positions"):
        load_grid("nope")
    with pytest.raises(ValueError, match="grid file not found"):
        load_grid(str(tmp_path / "missing.json"))
    good = tmp_path / "mine.json"
    good.write_text(json.dumps(_grid(variants={"h5": {"model": {"n_heads": 5}}})))
    grid = load_grid(str(good))
    with pytest.raises(ValueError, match=r"variant 'h5': attention.n_heads=5 does not divide d_model=24"):
        validate_grid(grid)
    with pytest.raises(ValueError, match=r"--set/options: 'out' is set by the harness"):
        validate_grid(load_grid("heads"), {"out": "x"})


def test_layering_lr_scale_eval_points_and_the_long_table():
    grid = Grid.from_dict(_grid(base={"preset": "tiny", "lr": 1e-3, "max_len": 16, "model": {"dropout": 0.0}},
                                variants={"a": {"model": {"norm": "pre"}}, "b": {"lr_scale": 3}},
                                extra_eval={"length_factor": 2}))
    a = resolve_variant(grid, "a", {"steps": 50, "model": {"dropout": 0.05}})
    assert a["model"] == {"dropout": 0.05, "norm": "pre", "max_len": 32}  # tiny's table (19) < 2 × 16
    assert a["eval_every"] == 5 and a["progress"] is False and a["lr"] == 1e-3
    assert resolve_variant(grid, "b", {"lr": 2e-3})["lr"] == pytest.approx(6e-3)
    assert "max_len" not in resolve_variant(load_grid("positions"), "learned")["model"]  # mini's 512 ≥ 256


def test_parse_set():
    assert parse_set(["lr=3e-4", "model.norm=pre", "model.qkv_proj=false", "schedule=cosine"]) == {
        "lr": 3e-4, "model": {"norm": "pre", "qkv_proj": False}, "schedule": "cosine"}
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_set(["lr"])
