"""Plugins (:mod:`qkv.plugins`): parts registered outside qkv, found by entry point or named, recorded
in saved models, and named when missing.

The plugin is docs/plugins.md's worked example, written to a temporary folder as the page shows it.
Everything that imports it runs in a fresh interpreter, so that its registrations never leak into
other tests; the in-process tests below undo what they register.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from qkv import plugins
from qkv.config import ModelConfig
from qkv.models.parts import check_parts
from qkv.nn.positional import POSITION_SCHEMES, register_position

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
SRC = Path(__file__).resolve().parents[1] / "src"


def plugin_source() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    found = [b for b in blocks if b.startswith("# qkvplug_demo.py")]
    assert len(found) == 1, "docs/plugins.md must show qkvplug_demo.py once"
    return found[0]


def write_plugin(folder: Path, *, entry_point: bool) -> Path:
    """``qkvplug_demo.py`` in ``folder`` and, with ``entry_point``, its ``dist-info`` declaring it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "qkvplug_demo.py").write_text(plugin_source(), encoding="utf-8")
    if entry_point:
        info = folder / "qkvplug_demo-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: qkvplug_demo\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text("[qkv.plugins]\ndemo = qkvplug_demo\n")
    return folder


def env_with(tmp: Path, *paths: Path) -> dict:
    env = {**os.environ, "QKV_CACHE_DIR": str(tmp / "cache"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(SRC), *map(str, paths)])}
    for name in ("CUDA_VISIBLE_DEVICES", "QKV_DEBUG", plugins.ENV):
        env.pop(name, None)
    return env


def python(code: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True,
                          text=True, timeout=300)
    return done


def qkv_cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qkv", *args], env=env, capture_output=True, text=True,
                          timeout=600)


SAVE = """
import sys, torch, qkv
from qkv.config import ModelConfig
from qkv.models.builders import build_masked_lm
{imports}
cfg = ModelConfig.preset("tiny", similarity="neg_l2", attention_path="dense_softmax", position="distance_penalty",
                         dropout=0.0)
torch.manual_seed(0)
model = build_masked_lm(cfg).eval()
ids = torch.randint(1, cfg.vocab_size, (2, 9))
with torch.no_grad():
    torch.save({{"ids": ids, "logits": model(ids).logits}}, sys.argv[2])
qkv.save(model, sys.argv[1])
from qkv.plugins import registered_by
print(registered_by("similarity", "neg_l2"), registered_by("backend", "dense_softmax"),
      registered_by("position", "distance_penalty"))
"""

LOAD = """
import sys, torch, qkv
want = torch.load(sys.argv[2])
model = qkv.load(sys.argv[1]{plugins}).model
with torch.no_grad():
    got = model(want["ids"]).logits
torch.testing.assert_close(got, want["logits"], rtol=0, atol=0)
print("same", "qkvplug_demo" in sys.modules, model.config.attention.similarity)
"""


def test_entry_point_plugin_is_found_in_fresh_processes(tmp_path):
    env = env_with(tmp_path, write_plugin(tmp_path / "site", entry_point=True))
    model, out = tmp_path / "model", tmp_path / "out.pt"
    saved = python(SAVE.format(imports=""), env, str(model), str(out))  # never imports qkvplug_demo itself
    assert saved.returncode == 0, saved.stderr[-3000:]
    assert saved.stdout.split() == ["qkvplug_demo"] * 3
    meta = json.loads((model / "qkv.json").read_text())
    assert sorted(meta["plugins"], key=lambda e: e["kind"]) == [
        {"kind": "backend", "name": "dense_softmax", "module": "qkvplug_demo"},
        {"kind": "position", "name": "distance_penalty", "module": "qkvplug_demo"},
        {"kind": "similarity", "name": "neg_l2", "module": "qkvplug_demo"}]
    loaded = python(LOAD.format(plugins=""), env, str(model), str(out))
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split() == ["same", "True", "neg_l2"]


def test_load_without_the_plugin_names_the_module_and_plugins_loads_it(tmp_path):
    site = write_plugin(tmp_path / "site", entry_point=False)
    model, out = tmp_path / "model", tmp_path / "out.pt"
    saved = python(SAVE.format(imports="import qkvplug_demo"), env_with(tmp_path, site), str(model), str(out))
    assert saved.returncode == 0, saved.stderr[-3000:]
    for env in (env_with(tmp_path), env_with(tmp_path, site)):  # not installed; on the path but not imported
        failed = python(LOAD.format(plugins=""), env, str(model), str(out))
        last = failed.stderr.strip().splitlines()[-1]
        assert "CheckpointError" in last and "plugin module 'qkvplug_demo', which is not loaded" in last, last
        assert "--plugin qkvplug_demo" in last and "plugins=['qkvplug_demo']" in last and "import qkvplug_demo" in last
    loaded = python(LOAD.format(plugins=", plugins=['qkvplug_demo']"), env_with(tmp_path, site), str(model), str(out))
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split() == ["same", "True", "neg_l2"]


PARTS_AGAINST_FORMULAS = """
import torch
import qkvplug_demo  # noqa: F401
from qkv.nn.attend import attend
from qkv.nn.positional import build_positions
from qkv.nn.similarity import build_similarity

torch.manual_seed(0)
q, k, v = (torch.randn(2, 3, 4, 5, dtype=torch.float64) for _ in range(3))
sim = build_similarity("neg_l2", n_heads=3, d_head=5)
d2 = ((q[:, :, :, None, :] - k[:, :, None, :, :]) ** 2).sum(-1)       # (B,H,T,S), the definition
torch.testing.assert_close(sim.scores(q, k), -d2)
bias = torch.randn(3, 4, 4, dtype=torch.float64)
mask = torch.tensor([True, True, False, True])[None, None, None, :]
hand = torch.softmax((-d2 + bias).masked_fill(~mask, float("-inf")), -1) @ v
for backend in ("dense_softmax", "explicit"):
    torch.testing.assert_close(attend(q, k, v, similarity=sim, bias=bias, mask=mask, backend=backend).output, hand)
slots = build_positions("distance_penalty", d_model=6, n_heads=3, max_len=8, max_distance=128)
table = slots.make_score_bias()(3, 5)   # width 128/16 = 8; queries at key positions 2, 3, 4
want = -torch.tensor([[2, 1, 0, 1, 2], [3, 2, 1, 0, 1], [4, 3, 2, 1, 0]]) / 8
torch.testing.assert_close(table, want)
assert slots.input is None and slots.make_qk_transform() is None
print("ok")
"""


def test_builtins_imported_by_a_plugin_stay_qkvs(tmp_path):
    code = """
    import sys
    from qkv import plugins
    assert "qkv.nn.similarity" not in sys.modules
    plugins.import_plugins(["qkvplug_demo"])   # imports qkv.nn: the built-ins register during its import
    from qkv.config import ModelConfig
    print(plugins.registered_by("backend", "sdpa"), plugins.registered_by("position", "learned"),
          plugins.registered_by("similarity", "neg_l2"), plugins.plugins_needed(ModelConfig()))
    """
    done = python(code, env_with(tmp_path, write_plugin(tmp_path / "site", entry_point=False)))
    assert done.returncode == 0 and done.stdout.split() == ["qkv", "qkv", "qkvplug_demo", "[]"], done.stderr[-3000:]


def test_plugin_parts_against_formulas(tmp_path):
    done = python(PARTS_AGAINST_FORMULAS, env_with(tmp_path, write_plugin(tmp_path / "site", entry_point=False)))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_cli_plugin_flag_pretrain_inspect_embed(tmp_path):
    site = write_plugin(tmp_path / "site", entry_point=False)
    env = env_with(tmp_path, site)
    docs = tmp_path / "docs.txt"
    words = "the cat sat on a mat while dogs ran in parks and birds sang over old green hills".split()
    docs.write_text("\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(60)))
    run = tmp_path / "run"
    model = json.dumps({"similarity": "neg_l2", "max_len": 40, "dropout": 0.0})
    tiny = ["--corpus", str(docs), "--out", str(run), "--preset", "tiny", "--model", model, "--vocab-size", "120",
            "--max-len", "24", "--batch-size", "4", "--warmup-steps", "1", "--steps", "2", "--eval-every", "2",
            "--eval-batches", "1", "--eval-batch-size", "4", "--save-every", "2", "--no-progress"]
    refused = qkv_cli(env, "pretrain", *tiny)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "similarity='neg_l2' is not allowed" in refused.stderr and "--plugin MODULE" in refused.stderr
    trained = qkv_cli(env, "pretrain", "--plugin", "qkvplug_demo", *tiny)
    assert trained.returncode == 0, trained.stderr[-3000:]
    # only the plugin's part: the built-ins it imported while it loaded are qkv's
    assert json.loads((run / "qkv.json").read_text())["plugins"] == [
        {"kind": "similarity", "name": "neg_l2", "module": "qkvplug_demo"}]
    shown = qkv_cli(env, "inspect", str(run), "the cat sat", "--out", str(tmp_path / "views"), "--plugin", "qkvplug_demo")
    assert shown.returncode == 0 and (tmp_path / "views" / "viewer.html").is_file(), shown.stderr[-3000:]
    vectors = tmp_path / "v.npy"
    embedded = qkv_cli(env, "embed", "--plugin", "qkvplug_demo", str(run), str(docs), "--out", str(vectors))
    assert embedded.returncode == 0 and vectors.is_file(), embedded.stderr[-3000:]
    missing = qkv_cli(env, "embed", str(run), str(docs), "--out", str(tmp_path / "w.npy"))
    lines = missing.stderr.strip().splitlines()
    assert missing.returncode == 2 and len(lines) == 1 and lines[0].startswith("qkv embed: error: "), missing.stderr
    assert "plugin module 'qkvplug_demo'" in lines[0] and "--plugin qkvplug_demo" in lines[0]


# ---------------------------------------------------------------- in-process: the record and the messages


@pytest.fixture()
def undo_registrations(monkeypatch):
    """Whatever a test registers or imports as a plugin is removed afterwards."""
    schemes, parts, modules = dict(POSITION_SCHEMES), dict(plugins._PARTS), set(sys.modules)
    yield
    POSITION_SCHEMES.clear()
    POSITION_SCHEMES.update(schemes)
    plugins._PARTS.clear()
    plugins._PARTS.update(parts)
    for name in set(sys.modules) - modules:
        if name.startswith("qkvplug_"):
            del sys.modules[name]


def test_builtins_are_recorded_as_qkv():
    import qkv.nn.backends  # noqa: F401
    import qkv.nn.norms  # noqa: F401

    for kind, name in (("similarity", "scaled_dot"), ("backend", "sdpa"), ("norm", "rmsnorm"), ("position", "rope"),
                       ("position", "none")):
        assert plugins.registered_by(kind, name) == "qkv", (kind, name)
    assert plugins.registered_by("similarity", "no-such") is None
    assert plugins.plugins_needed(ModelConfig.preset("tiny", position="rope", norm_type="rmsnorm")) == []


def test_import_plugins_missing_or_broken_module_is_one_clear_error(tmp_path, monkeypatch, undo_registrations):
    with pytest.raises(plugins.PluginError, match=r"plugin module 'qkvplug_absent' could not be imported: "
                       r"ModuleNotFoundError: No module named 'qkvplug_absent'; install it or put it on PYTHONPATH"):
        plugins.import_plugins(["qkvplug_absent"])
    (tmp_path / "qkvplug_broken.py").write_text("raise RuntimeError('needs a licence key')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(plugins.PluginError, match="'qkvplug_broken' could not be imported: RuntimeError: needs a"):
        plugins.import_plugins(["qkvplug_broken"])
    with pytest.raises(plugins.PluginError, match="not a module name"):
        plugins.import_plugins([""])


def test_a_plugin_position_scheme_in_a_model_and_its_record(tmp_path, monkeypatch, undo_registrations):
    from qkv.models.builders import build_encoder

    (tmp_path / "qkvplug_unit.py").write_text(textwrap.dedent("""
        import torch
        from qkv.nn.positional import register_position

        class Ramp(torch.nn.Module):
            def __init__(self, d_model):
                super().__init__()
                self.d_model = d_model

            def forward(self, length):            # -> (T, C): position p adds p/100 to every feature
                return torch.arange(length, dtype=torch.float32)[:, None].expand(length, self.d_model) / 100

        @register_position("unit_ramp", slot="input")
        def ramp(sizes):
            return Ramp(sizes.d_model)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="positions.scheme='unit_ramp' is not allowed.*--plugin MODULE"):
        check_parts(ModelConfig.preset("tiny", position="unit_ramp"))
    assert plugins.import_plugins(["qkvplug_unit"]) == ["qkvplug_unit"]
    cfg = ModelConfig.preset("tiny", position="unit_ramp", position_qk_only=True)  # an input scheme: allowed
    assert plugins.registered_by("position", "unit_ramp") == "qkvplug_unit"
    assert plugins.plugins_needed(cfg) == [{"kind": "position", "name": "unit_ramp", "module": "qkvplug_unit"}]
    enc = build_encoder(cfg.replace(position_qk_only=False))
    assert type(enc.embeddings.positions).__name__ == "Ramp"
    with pytest.raises(ValueError, match="already registered \\(by qkvplug_unit\\)"):
        register_position("unit_ramp", slot="input")(lambda s: None)
    with pytest.raises(ValueError, match="slot='bias' is not allowed; allowed: input, qk_transform, score_bias"):
        register_position("unit_other", slot="bias")


def test_recorded_parts_that_are_missing_are_named(undo_registrations):
    plugins.check_recorded([{"kind": "similarity", "name": "dot", "module": "qkv"}], "m/qkv.json")
    with pytest.raises(plugins.PluginError, match="m/qkv.json: the model uses norm 'acme' from plugin module "
                       "'acme.parts', which is not loaded; .*--plugin acme.parts"):
        plugins.check_recorded([{"kind": "norm", "name": "acme", "module": "acme.parts"}], "m/qkv.json")
    with pytest.raises(plugins.PluginError, match="registered by a script \\(__main__\\)"):
        plugins.check_recorded([{"kind": "norm", "name": "acme", "module": "__main__"}], "m/qkv.json")
    with pytest.raises(plugins.PluginError, match="needs kind, name and module"):
        plugins.check_recorded([{"kind": "norm"}], "m/qkv.json")


def test_broken_installed_plugin_warns_and_is_named_on_a_miss(tmp_path, monkeypatch, undo_registrations):
    (tmp_path / "qkvplug_fails.py").write_text("raise ImportError('needs acme-kernels')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.ENV, "qkvplug_fails")
    monkeypatch.setattr(plugins, "_loaded", False)
    monkeypatch.setattr(plugins, "_failed", {})
    with pytest.warns(UserWarning, match="'qkvplug_fails' could not be imported: ImportError: needs acme-kernels"):
        plugins.load_plugins()
    plugins.load_plugins()  # once per process: no second warning, no second import
    assert plugins.failed_plugins() == {"qkvplug_fails": "ImportError: needs acme-kernels"}
    with pytest.raises(ValueError, match="plugins that failed to import: qkvplug_fails"):
        check_parts(ModelConfig.from_flat(similarity="acme_l2"))


def test_named_plugins_are_passed_to_child_processes(monkeypatch):
    monkeypatch.setenv(plugins.ENV, "acme.parts")
    plugins.share_with_children(["qkvplug_demo", "acme.parts"])
    assert os.environ[plugins.ENV] == "acme.parts,qkvplug_demo"
    monkeypatch.delenv(plugins.ENV)
    plugins.share_with_children([])  # nothing named: the environment is left alone
    assert plugins.ENV not in os.environ


def test_a_plugins_colour_codes_never_reach_the_terminal(tmp_path, monkeypatch, capsys, undo_registrations):
    from qkv.cli import main

    (tmp_path / "qkvplug_colour.py").write_text(
        "raise RuntimeError('\\x1b[1;31mlicence\\x1b[0m key \\x07missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["pretrain", "--plugin", "qkvplug_colour", "--corpus", "dataset:pydoc", "--out",
                 str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "RuntimeError: licence key missing" in err and "\x1b" not in err and "\x07" not in err
    assert len(err.strip().splitlines()) == 1
