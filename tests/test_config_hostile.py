"""Issue 42, item 1 (config side): what an outside hostile suite found. Config load is linear in the size of
codec.exact_layers (131,072 layers: milliseconds, not minutes); every error is at most 1 KiB, however long
the list, the vLLM skip list or the path it quotes; an empty config file, an unreadable one and a path that
is not a regular file (a FIFO with no writer used to hang) are errors naming the file; a null codec width is
an error, not lossless."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from tiercache import files
from tiercache.config import TierCacheConfig
from tiercache.errors import ConfigError, clipped

MAX_MESSAGE = 1024
ALL_LAYERS = list(range(-(1 << 16), 1 << 16))  # 131,072 distinct indices: every one EXACT_LAYERS_BOUND allows


def exact(layers: list, keys: object = 4) -> dict:
    return {"codec": {"keys": keys, "values": 4, "exact_layers": layers}}


def refused(load, *fragments: str) -> str:
    """load() raises a ConfigError within a second, one line of at most 1 KiB containing every fragment."""
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load()
    message = str(info.value)
    assert time.monotonic() - start < 1.0
    assert "\n" not in message and len(message) <= MAX_MESSAGE, (len(message), message[:300])
    for fragment in fragments:
        assert fragment in message, message
    return message


# ------------------------------------------------------------------ codec.exact_layers: linear, bounded
def test_the_largest_exact_layers_list_is_accepted_in_under_a_second():
    start = time.monotonic()
    config = TierCacheConfig.from_dict(exact(ALL_LAYERS))
    assert time.monotonic() - start < 1.0
    assert config.codec.exact_layers == tuple(ALL_LAYERS)
    assert config.codec.exact_layer_indices(1 << 16) == tuple(range(1 << 16))  # ±i name one layer: merged


@pytest.mark.parametrize(
    ("layers", "keys", "fragments"),
    [([*ALL_LAYERS, 7], 4, ["codec.exact_layers: layer 7 is listed twice", "list it once"]),
     ([ALL_LAYERS[0], *ALL_LAYERS], 4, ["layer -65536 is listed twice"]),
     (ALL_LAYERS, "none", ["codec.keys or codec.values is lossless", "drop codec.exact_layers"]),
     ([*ALL_LAYERS, "x" * 100_000], 4, ["codec.exact_layers: got 'xxx", "expected a list of distinct"]),
     ([*range(20_000), 1 << 20], 4, ["got 1048576 in [0, 1, 2", "expected a list"])],
    ids=["duplicate-last", "duplicate-first", "lossless", "long-text", "20k-out-of-range"],
)  # fmt: skip
def test_a_huge_exact_layers_list_is_refused_fast_in_one_short_line(layers, keys, fragments):
    refused(lambda: TierCacheConfig.from_dict(exact(layers, keys), "t.yaml"), "(t.yaml)", *fragments)


def test_the_connector_path_is_linear_too():
    from tiercache.connectors.common import load_config

    transfer = SimpleNamespace(kv_connector_extra_config=exact([*ALL_LAYERS, 0]))
    refused(lambda: load_config(SimpleNamespace(kv_transfer_config=transfer)), "layer 0 is listed twice")


@pytest.mark.parametrize("backend", ["CUSTOM", None])
def test_the_connectors_refusal_of_exact_layers_is_short(backend):
    """20,000 layers made a 129 KB message: the list is shown shortened, the fix is still named."""
    from tiercache.connectors.common import Geometry

    codec = TierCacheConfig.from_dict(exact(list(range(20_000)))).codec
    vllm = SimpleNamespace(attention_config=SimpleNamespace(backend=SimpleNamespace(name=backend)))
    groups = SimpleNamespace(kv_cache_groups=[])
    refused(lambda: Geometry.from_vllm(vllm, groups, codec), "codec.exact_layers [0, 1, 2", "Drop codec")


def vllm_config(skip: list, layers: int) -> SimpleNamespace:
    model = SimpleNamespace(hf_text_config=SimpleNamespace(num_hidden_layers=layers), dtype=torch.bfloat16,
                            get_head_size=lambda: 128)  # fmt: skip
    cache = SimpleNamespace(kv_cache_dtype_skip_layers=skip, cache_dtype="int4_per_token_head")
    return SimpleNamespace(model_config=model, cache_config=cache, attention_config=None)


@pytest.mark.parametrize(
    ("skip", "layers", "exact_layers", "fragments"),
    [([str(i) for i in range(200_000)], 30, [0, 1], ["skip-layers is ['0', '1', '2'", "Start vLLM with"]),
     ([], 1 << 16, list(range(1 << 16)), ["is layers [0, 1, 2", "--kv-cache-dtype-skip-layers 0 1 2 3"]),
     (["0", "x" * 100_000], 30, [0], ["skip-layers has 'xxx", "layer indices"])],
    ids=["200k-skip-list", "65536-exact-layers", "long-entry"],
)  # fmt: skip
def test_the_start_up_check_against_vllms_skip_list_is_short(skip, layers, exact_layers, fragments):
    """A 200,000-entry --kv-cache-dtype-skip-layers made a 1.9 MB message."""
    from tiercache.connectors.attention.exact_layers import resolve, skips_layers

    skips_layers()  # imports vLLM's config once, outside the timed part
    config = TierCacheConfig.from_dict(exact(exact_layers), "t.yaml")
    refused(lambda: resolve(vllm_config(skip, layers), config), "tiercache primary mode", *fragments)


def test_a_config_error_is_at_most_1_kib_keeping_the_key_and_the_fix():
    message = str(ConfigError("tiers.vram: got " + "9" * 100_000 + "; set a size such as 4GiB"))
    assert len(message) <= MAX_MESSAGE
    assert message.startswith("tiers.vram: got 999") and message.endswith("; set a size such as 4GiB")
    assert str(ConfigError("codec: got 'x'")) == "codec: got 'x'"  # short messages stay as they are
    assert clipped("a\nb") == "a\\nb" and len(clipped("/d" * 5000)) <= 200


# ------------------------------------------------------------------ the file itself
@pytest.mark.parametrize("text", ["", "\n\n   \n", "# tiers: {vram: 1GiB}\n", "---\n", "~\n", "null\n"])
def test_an_empty_config_file_is_an_error_naming_the_file(tmp_path, text):
    """It used to mean the defaults (4 GiB VRAM + 8 GiB DRAM) without a word."""
    path = tmp_path / "tiers.yaml"
    path.write_text(text)
    refused(lambda: TierCacheConfig.from_yaml(path), str(path), "empty", "examples/tiers.yaml")
    refused(lambda: TierCacheConfig.load(path, {"codec": "tq4"}), str(path), "empty")  # overrides too


def test_an_unreadable_config_file_is_an_error_naming_the_file_and_the_fix(tmp_path, monkeypatch):
    missing = tmp_path / "missing.yaml"
    refused(lambda: TierCacheConfig.from_yaml(missing), str(missing), "No such file", "check the path")
    dangling = tmp_path / "dangling.yaml"
    dangling.symlink_to(missing)
    refused(lambda: TierCacheConfig.from_yaml(dangling), str(dangling), "No such file")

    path = tmp_path / "tiers.yaml"
    path.write_text("codec: tq4\n")

    def denied(*args, **kwargs):  # root reads any mode of file: the refusal os.open gives another user
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files.os, "open", denied)
    refused(lambda: TierCacheConfig.from_yaml(path), str(path), "Permission denied", "may read the file")


def load_in_thread(path, timeout: float = 5.0) -> BaseException | None:
    """from_yaml(path) in a daemon thread joined with a timeout: what it raised (None: it returned)."""
    outcome: list[BaseException | None] = []

    def run():
        try:
            TierCacheConfig.from_yaml(path)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():  # blocked in open(): a writer end releases it, then the test fails
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout)
        pytest.fail(f"loading {path} hung for {timeout}s")
    return outcome[0]


def test_a_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "tiers.yaml"
    os.mkfifo(fifo)
    error = load_in_thread(fifo)
    assert isinstance(error, ConfigError), error
    assert str(fifo) in str(error) and "FIFO" in str(error) and "not a regular file" in str(error)


@pytest.mark.parametrize(
    ("make", "kind"),
    [(lambda p: p.mkdir(), "a directory"), (lambda p: p.symlink_to("/dev/null"), "a character device")],
)
def test_anything_but_a_regular_file_is_refused_naming_it(tmp_path, make, kind):
    path = tmp_path / "tiers.yaml"
    make(path)
    refused(lambda: TierCacheConfig.from_yaml(path), f"config file {path} is {kind}, not a regular file")


def test_a_long_path_is_shortened_in_every_message(tmp_path):
    folder = tmp_path
    for i in range(14):  # about 3,600 characters: under PATH_MAX, over any message
        folder = folder / (f"{i:02d}" + "d" * 250)
    folder.mkdir(parents=True)
    path = folder / "tiers.yaml"
    cases = (("codec: [\n", "not valid YAML"), ("tiers: {vram: 0}\n", "one block"), ("", "empty"))
    for text, fragment in cases:
        path.write_text(text)
        message = refused(lambda: TierCacheConfig.from_yaml(path), fragment)
        assert str(tmp_path)[:20] in message and "dddd…dddd" in message and "tiers.yaml" in message


# ------------------------------------------------------------------ null codec widths
@pytest.mark.parametrize(
    ("text", "key"),
    [("codec: {keys: null, values: 4}\n", "codec.keys"),
     ("codec: {keys: 8, values: ~}\n", "codec.values"),
     ("codec:\n  keys:\n  values: 4\n", "codec.keys")],
)  # fmt: skip
def test_a_null_width_is_refused_not_read_as_lossless(tmp_path, text, key):
    path = tmp_path / "tiers.yaml"
    path.write_text(text)
    refused(lambda: TierCacheConfig.from_yaml(path), f"{key}: got null", "1..8", '"none" for lossless')
    with pytest.raises(ConfigError, match=rf"{key}: got null \(<dict>\)"):
        TierCacheConfig.from_dict({"codec": {"keys": 8, "values": 4, key.split(".")[1]: None}})


@pytest.mark.parametrize("word", ["none", "None", "raw", "lossless"])
def test_lossless_is_still_the_word(tmp_path, word):
    path = tmp_path / "tiers.yaml"
    path.write_text(f"codec: {{keys: {word}, values: 4}}\ntiers: {{vram: 1GiB}}\n")
    config = TierCacheConfig.from_yaml(path)
    assert config.codec.key_bits is None and config.codec.value_bits == 4 and config.tiers.vram.bytes == 2**30
    assert TierCacheConfig.from_dict(config.to_dict()).codec == config.codec  # to_dict writes "none"
