"""Connector pieces without an engine: step plans and reports as bytes through vLLM's metadata objects,
worker-report aggregation, K/V views against vLLM's own CPU cache op, config resolution, registration by
name, the codec round trip into views."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch

from tiercache.codecs import KVCodecSpec
from tiercache.connectors.common import load_config
from tiercache.connectors.metadata import TierCacheMetadata, TierCacheWorkerMeta
from tiercache.connectors.worker.codec_io import decode_blocks, encode_blocks
from tiercache.connectors.worker.kv_views import cpu_block_map, kv_access
from tiercache.layout import BlockLayout
from tiercache.wire import (
    DRAM,
    VRAM,
    JobResult,
    LoadItem,
    RemoteItem,
    StepPlan,
    StepResult,
    StoreItem,
    TransferJob,
    WorkerReport,
)  # fmt: skip

H = b"\x01" * 32


def test_step_plans_and_reports_cross_the_process_boundary_as_bytes():
    plan = StepPlan(
        7, loads=(LoadItem(H, DRAM, 3, 11), LoadItem(H, None, -1, 12)),
        stores=(StoreItem(b"\x02" * 32, VRAM, 0, 5),),
        jobs=(TransferJob(1, VRAM, DRAM, (0, 1), (8, 9), (H, b"\x03" * 32)),),
        uploads=(RemoteItem(b"\x04" * 32, 2),), fetches=(RemoteItem(H, 3),),
    )  # fmt: skip
    meta = TierCacheMetadata.of(plan)
    sent = pickle.loads(pickle.dumps(meta))  # how vLLM moves it to the worker processes
    assert sent.__dict__.keys() >= {"data"} and sent.plan() == plan and sent.plan() is sent.plan()
    report = WorkerReport((StepResult(7, (True, False), (True,)),), (JobResult(1, True, 2, 64, 0.5),), ("x",))
    assert pickle.loads(pickle.dumps(TierCacheWorkerMeta.of(report))).reports() == [report]


def test_worker_reports_aggregate_across_ranks():
    job = JobResult(1, True, 1, 8, 0.1)
    a = WorkerReport((StepResult(3, (True,), (True, True)),), (job,))
    steps = (StepResult(3, (False,), (True, False)), StepResult(4, (), ()))
    b = WorkerReport(steps, (job,), ("rank 1: boom",))
    merged = TierCacheWorkerMeta.of(a).aggregate(TierCacheWorkerMeta.of(b))
    assert merged.reports() == [a, b]  # every rank's report reaches the scheduler, which ANDs them per step
    with pytest.raises(TypeError, match="cannot aggregate"):
        merged.aggregate(SimpleNamespace())


DTYPES = [torch.float32, torch.bfloat16, torch.float16]
GEOMETRIES = [(32, 2, 64), (64, 4, 128), (32, 1, 128)]  # block_size, kv heads, head_dim


def cpu_isa(dtype, block_size, head_dim) -> str:
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return _get_attn_isa(dtype, block_size, head_dim)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("block_size", "heads", "head_dim"), GEOMETRIES)
def test_cpu_access_reads_what_vllm_cache_update_wrote(dtype, block_size, heads, head_dim):
    from vllm import _custom_ops as ops

    bs, h, d = block_size, heads, head_dim
    isa = cpu_isa(dtype, bs, d)
    cache = torch.zeros(3, h, bs, 2 * d, dtype=dtype)
    k_acc, v_acc = kv_access(cache, "CPU_ATTN", bs, h, d, isa)
    gen = torch.Generator().manual_seed(0)
    key, value = (torch.randn(2 * bs, h, d, generator=gen).to(dtype) for _ in range(2))
    rows = cache.view(3, h, 2 * bs, d)
    slots = torch.cat([torch.arange(2 * bs, 3 * bs), torch.arange(0, bs)])  # block 2, then block 0
    ops.cpu_attn_reshape_and_cache(key, value, rows[:, :, :bs], rows[:, :, bs:], slots, isa)
    ids = torch.tensor([2, 0])
    assert torch.equal(k_acc.read(ids), key.view(2, bs, h, d))
    assert torch.equal(v_acc.read(ids), value.view(2, bs, h, d))
    k_acc.write(torch.tensor([1]), key[:bs].view(1, bs, h, d))  # writes land where vLLM would read them
    v_acc.write(torch.tensor([1]), value[:bs].view(1, bs, h, d))
    assert torch.equal(cache[1], cache[2])


def test_cpu_block_map_is_a_permutation():
    k_map, v_map = cpu_block_map(torch.float32, 32, 2, 64, cpu_isa(torch.float32, 32, 64))
    cells = torch.cat([k_map.flatten(), v_map.flatten()]).sort().values
    assert torch.equal(cells, torch.arange(2 * 32 * 2 * 64))


@pytest.mark.parametrize("shape_kind", ["last_dim", "kv_first", "kv_second"])
def test_gpu_layout_access(shape_kind):
    nb, bs, h, d = 3, 16, 2, 8
    k = torch.randn(nb, bs, h, d)
    v = torch.randn(nb, bs, h, d)
    if shape_kind == "last_dim":  # logical [NB, H, BS, 2D], physical NHD
        cache, name = torch.cat([k, v], -1).transpose(1, 2), "FLASH_ATTN"
    elif shape_kind == "kv_first":
        cache, name = torch.stack([k, v]), "ANY"
    else:
        cache, name = torch.stack([k, v], 1), "ANY"
    k_acc, v_acc = kv_access(cache, name, bs, h, d)
    ids = torch.arange(nb)
    assert torch.equal(k_acc.read(ids), k) and torch.equal(v_acc.read(ids), v)
    k_acc.write(torch.tensor([1]), torch.zeros(1, bs, h, d))  # writes go through to the cache
    assert torch.equal(kv_access(cache, name, bs, h, d)[0].read(torch.tensor([1])), torch.zeros(1, bs, h, d))
    assert torch.equal(v_acc.read(ids), v)
    with pytest.raises(ValueError, match="unsupported KV cache layout"):
        kv_access(torch.zeros(nb, bs, h, 3 * d), name, bs, h, d)


@pytest.mark.parametrize("preset", ["none", "tq4", "k8v4", "k3v4"])
def test_encode_decode_through_the_cache(preset):
    """encode_blocks → decode_blocks into other blocks equals codec.decode(codec.encode(x)) per side."""
    layers, nb, bs, h, d = 2, 6, 32, 2, 64
    spec = KVCodecSpec.from_preset(preset)
    codec = spec.build(d, torch.float32)
    layout = BlockLayout.from_spec(spec, layers, h, d, bs, 4)
    isa = cpu_isa(torch.float32, bs, d)
    gen = torch.Generator().manual_seed(0)
    caches = [torch.randn(nb, h, bs, 2 * d, generator=gen) for _ in range(layers)]
    access = [kv_access(c, "CPU_ATTN", bs, h, d, isa) for c in caches]
    ks, vs = [a[0] for a in access], [a[1] for a in access]
    blocks = encode_blocks(codec, ks, vs, [0, 2], layout)
    decode_blocks(codec, blocks, ks, vs, [4, 5])
    src, dst = torch.tensor([0, 2]), torch.tensor([4, 5])
    for layer in range(layers):
        for acc, side in ((ks[layer], codec.keys), (vs[layer], codec.values)):
            expect = side.decode(*side.encode(acc.read(src)), torch.float32)
            torch.testing.assert_close(acc.read(dst), expect, atol=1e-5, rtol=0)


def test_config_file_with_inline_overrides(tmp_path, monkeypatch):
    path = tmp_path / "tiers.yaml"
    path.write_text("codec: tq4\ntiers: {vram: 1GiB, dram: 2GiB}\n")
    transfer = SimpleNamespace(kv_connector_extra_config={"config": str(path), "tiers": {"dram": "512MiB"}})
    config = load_config(SimpleNamespace(kv_transfer_config=transfer))
    assert (
        config.codec.name == "tq4" and config.tiers.vram.bytes == 2**30 and config.tiers.dram.bytes == 2**29
    )
    monkeypatch.setenv("TIERCACHE_CONFIG", str(path))
    transfer.kv_connector_extra_config = {"codec": "none"}
    config = load_config(SimpleNamespace(kv_transfer_config=transfer))
    assert config.codec.name == "none" and config.tiers.vram.bytes == 2**30


def test_registered_by_name_through_the_plugin_entry_point():
    pytest.importorskip("vllm")
    from importlib.metadata import entry_points

    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "tiercache"]
    register = ep.load()
    register()
    register()  # idempotent: vLLM loads general plugins in every process
    cls = KVConnectorFactory.get_connector_class_by_name("TierCacheConnector")
    assert cls.__module__ == "tiercache.connectors.vllm"


def test_prometheus_metrics_carry_each_counter_with_its_labels():
    from functools import partial

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from tiercache.connectors.metrics import METRICS, TierCachePromMetrics, TierCacheStats

    registry = CollectorRegistry()
    types = {cls: partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram)}
    config = SimpleNamespace(kv_transfer_config=None)
    prom = TierCachePromMetrics(config, types, ["model_name", "engine"], {0: ["m", "0"]})
    first = {"totals": {"hits_dram": 1, "misses": 2}, "gauges": {}}
    prom.observe(first, engine_idx=0)
    data = {
        "totals": {"hits_dram": 4, "misses": 2, "tokens_loaded": 128, "io_spill_bytes": 8192,
                   "io_spill_us": 4, "evicted_drop_by_graph": 3, "declined_by_graph": 5,
                   "failures_no_room": 1, "remote_fetched": 6, "remote_uploads": 2},
        "gauges": {"used_blocks_vram": 3, "capacity_blocks_vram": 4},
    }  # fmt: skip
    # vLLM aggregates an interval's stats: totals only grow, the newest wins
    stats = TierCacheStats(data={"totals": {"misses": 3}}).aggregate(TierCacheStats(data=data))
    prom.observe(stats.data, engine_idx=0)  # each counter grows by its total's increase since `first`
    value = lambda name, **labels: registry.get_sample_value(
        name, {"model_name": "m", "engine": "0", **labels}
    )
    assert value("vllm:tiercache_hit_blocks_total", tier="dram") == 4
    assert value("vllm:tiercache_lookup_misses_total") == 3
    assert value("vllm:tiercache_transfer_bytes_total", direction="spill") == 8192
    assert value("vllm:tiercache_transfer_seconds_total", direction="spill") == pytest.approx(4e-6)
    assert value("vllm:tiercache_transfer_gbps", direction="spill") == pytest.approx(8192 / 4e-6 / 1e9)
    assert value("vllm:tiercache_evictions_total", policy="graph", action="drop") == 3
    assert value("vllm:tiercache_declined_blocks_total", policy="graph") == 5
    assert value("vllm:tiercache_failures_total", cause="no_room") == 1
    assert value("vllm:tiercache_remote_blocks_total", event="fetched") == 6
    assert value("vllm:tiercache_remote_blocks_total", event="uploads") == 2
    assert value("vllm:tiercache_occupancy", tier="vram") == 0.75
    exported = {m.name for m in registry.collect()}
    assert {"vllm:tiercache_" + name for name in METRICS} == exported
    assert TierCacheStats().is_empty() and not stats.is_empty()


def test_io_timer_on_cpu_times_the_call():
    import time

    from tiercache.connectors.worker.io_timer import IoTimer

    timer = IoTimer(torch.device("cpu"))
    with timer.measure("store", 3, 300):
        time.sleep(0.01)
    (sample,) = timer.take()
    assert (sample.direction, sample.blocks, sample.bytes) == ("store", 3, 300) and sample.seconds >= 0.01
    assert timer.take() == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_io_timer_on_a_gpu_reports_bytes_at_once_and_seconds_once_resolved():
    from tiercache.connectors.worker.io_timer import IoTimer

    timer = IoTimer(torch.device("cuda"))
    x = torch.randn(1 << 24, device="cuda")
    with timer.measure("load", 8, 1 << 20):
        x.mul_(2)
    first = timer.take()
    assert first[0] == first[0].__class__("load", 8, 1 << 20, 0.0)
    torch.cuda.synchronize()
    later = [s for s in first[1:] + timer.take() if s.seconds > 0]
    assert len(later) == 1 and (later[0].blocks, later[0].bytes) == (0, 0) and later[0].direction == "load"
    assert timer.pending == 0


def test_config_is_checked_when_vllm_builds_its_config_before_any_engine_starts(tmp_path):
    """vLLM's VllmConfig asks the connector class requires_piecewise_for_cudagraph(extra_config) where CUDA
    graphs are on, in the process that builds the config, before engine processes start or weights load: a
    bad tiercache config fails there, as one ConfigError. Called here as vLLM calls it, on the class vLLM's
    factory resolves."""
    pytest.importorskip("vllm")
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from tiercache.connectors.plugin import register
    from tiercache.errors import ConfigError

    register()
    path = tmp_path / "tiers.yaml"
    path.write_text("codec: k8v4\ntiers: {vram: 64MiB, dram: 128MiB}\n")
    for extra, error in (
        ({"config": str(path)}, None),
        ({"config": str(path), "codec": "k5v9"}, "codec"),
        ({"config": str(tmp_path / "missing.yaml")}, "missing.yaml"),
    ):
        transfer = KVTransferConfig(
            kv_connector="TierCacheConnector", kv_role="kv_both", kv_connector_extra_config=extra
        )
        cls = KVConnectorFactory.get_connector_class(transfer)
        if error is None:
            assert cls.requires_piecewise_for_cudagraph(transfer.kv_connector_extra_config) is False
        else:
            with pytest.raises(ConfigError, match=error) as caught:
                cls.requires_piecewise_for_cudagraph(transfer.kv_connector_extra_config)
            assert "\n" not in str(caught.value)
