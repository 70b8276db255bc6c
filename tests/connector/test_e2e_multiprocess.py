"""vLLM's default multi-process mode (issue test 7): engine core and worker in their own processes
(VLLM_ENABLE_V1_MULTIPROCESSING=1, the "mp" executor), so the two connector sides share no memory; a
request sharing a 5-block prefix is served from the tiers and matches the run without the connector; the
connector's metrics cross from the engine process to this one (vLLM's stats path) and LLM.get_metrics()
reads them."""

from __future__ import annotations

from helpers import BLOCK, SHARED, connector_config, engine, generate, tokens


def test_multiprocess_reuse_equals_no_connector(tiny_model, baseline):
    first, second = SHARED["multiprocess"]
    with engine(tiny_model, connector_config("none"), multiprocess=True, disable_log_stats=False) as llm:
        outs = generate(llm, [first, second])
        metrics = llm.get_metrics()
    assert tokens(outs) == [baseline[first], baseline[second]]
    assert [o.num_cached_tokens for o in outs] == [0, 5 * BLOCK]
    loaded = sum(m.value for m in metrics if m.name == "vllm:tiercache_tokens_loaded")
    hits = sum(m.value for m in metrics if m.name == "vllm:tiercache_hit_blocks")
    assert loaded == 5 * BLOCK and hits == 5
