"""The wire between the processes: every type round-trips through one encode and one decode, validates itself,
and malformed bytes become a ValueError naming the type."""

from __future__ import annotations

import msgpack
import pytest

from tiercache.wire import (
    DRAM,
    VRAM,
    IoSample,
    JobResult,
    LoadFailure,
    LoadItem,
    RemoteCount,
    RemoteItem,
    StepPlan,
    StepResult,
    StoreItem,
    TransferJob,
    WorkerReport,
    decode,
    encode,
)

H1, H2 = b"\x01" * 32, b"\x02" * 32
PLAN = StepPlan(
    3,
    loads=(LoadItem(H1, DRAM, 7, 11), LoadItem(H2, None, -1, 12)),
    stores=(StoreItem(H2, VRAM, 0, 5),),
    jobs=(
        TransferJob(4, VRAM, DRAM, (0, 1), (9, 10), (H1, H2)),
        TransferJob(5, DRAM, VRAM, (9,), (2,), (H1,)),
    ),
    disk_writes=(RemoteItem(H1, 9),),
    disk_reads=(RemoteItem(H2, 10),),
    disk_drops=(H1, H2),
)
REPORT = WorkerReport(
    steps=(StepResult(3, (True, False), (True,), (LoadFailure(1, "hash mismatch: vram slot 7"),)),
           StepResult(4, (), ())),
    jobs=(JobResult(4, True, 2, 4096, 0.25), JobResult(5, False, 1, 0, 0.0, "injected")),
    errors=("rank 0: load refused",),
    io=(IoSample("load", 1, 2048, 1e-4), IoSample("store", 1, 2048, 2.5e-4)),
    rank=1, remote=(RemoteCount("written", 30), RemoteCount("write_failures", 2)),
    disk=(RemoteCount("written", 4), RemoteCount("bad_values", 1)),
)  # fmt: skip


@pytest.mark.parametrize("value", [PLAN, REPORT, StepPlan(0), WorkerReport()])
def test_round_trip(value):
    data = encode(value)
    assert isinstance(data, bytes) and decode(data, type(value)) == value


def test_jobs_name_both_tiers_and_their_blocks():
    spill, warm = PLAN.jobs
    assert (spill.kind, warm.kind) == ("spill", "warm") and len(spill) == 2
    with pytest.raises(ValueError, match="2 sources, 1 destinations, 2 blocks"):
        TransferJob(1, VRAM, DRAM, (0, 1), (2,), (H1, H2))
    with pytest.raises(ValueError, match="both vram"):
        TransferJob(1, VRAM, VRAM, (0,), (1,), (H1,))
    with pytest.raises(ValueError, match="tier must be one of vram, dram"):
        StoreItem(H1, "disk", 0, 0)


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",  # not msgpack
        msgpack.packb([3, [], []]),  # a field missing
        msgpack.packb([3, [[H1, "dram", 7]], [], []]),  # a load item missing its block id
        msgpack.packb([3, [[H1, "disk", 7, 11]], [], []]),  # an unknown tier
        msgpack.packb([True, [], [], []]),  # a bool is no step number
        msgpack.packb(["3", [], [], []]),
    ],
)
def test_malformed_bytes_are_a_value_error(data):
    with pytest.raises(ValueError, match="malformed StepPlan on the wire"):
        decode(data, StepPlan)


def test_an_io_sample_names_a_direction_it_knows():
    with pytest.raises(ValueError, match="IoSample.direction"):
        IoSample("sideways", 1, 1, 0.0)
