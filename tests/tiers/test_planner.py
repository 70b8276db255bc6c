"""`tiercache plan` against hand-computed numbers for two model geometries."""

import json

import pytest

from tiercache.cli import main
from tiercache.cli.plan import ModelGeometry, load_model_config, memory_warnings, model_geometry, plan_rows
from tiercache.codecs import KVCodecSpec

LLAMA3_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
}
SMOLLM2_135M = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
}

# Hand-computed bytes per token: bf16 = L·H·d·2·2, fp8 = L·H·d·2, TQ = L·H·[(d·k/8 + 4) + (d·v/8 + 4)]
#   Llama-3-8B (L 32, H 8, d 128): K4V4 32·8·(68+68) K8V4 32·8·(132+68) K3V4 32·8·(52+68) K8V8 32·8·(132+132)
#   SmolLM2-135M (L 30, H 3, d 64): K4V4 30·3·(36+36) K8V4 30·3·(68+36) K3V4 30·3·(28+36) K8V8 30·3·(68+68)
EXPECTED = {
    "llama": {"bf16": 131072, "fp8": 65536, "tq4": 34816, "k8v4": 51200, "k3v4": 30720, "k8v8": 67584},
    "smollm": {"bf16": 23040, "fp8": 11520, "tq4": 6480, "k8v4": 9360, "k3v4": 5760, "k8v8": 12240},
}
GIB = 2**30


def by_name(rows):
    out = {}
    for row in rows:
        key = row.name.split(" (")[1].rstrip(")") if "(" in row.name else row.name
        out[key] = row
    return out


@pytest.mark.parametrize(("config", "key", "geometry"), [
    (LLAMA3_8B, "llama", ModelGeometry(32, 8, 128)),
    (SMOLLM2_135M, "smollm", ModelGeometry(30, 3, 64)),
])  # fmt: skip
def test_bytes_and_tokens_per_tier(config, key, geometry):
    assert model_geometry(config) == geometry
    rows = by_name(plan_rows(geometry, 4 * GIB, 32 * GIB))
    for name, bytes_per_token in EXPECTED[key].items():
        assert rows[name].bytes_per_token == bytes_per_token, name
        assert rows[name].tokens_vram == 4 * GIB // bytes_per_token
        assert rows[name].tokens_dram == 32 * GIB // bytes_per_token


def test_hand_computed_token_counts():
    rows = by_name(plan_rows(ModelGeometry(32, 8, 128), 4 * GIB, 32 * GIB))
    assert rows["tq4"].tokens_vram == 123_361  # 4,294,967,296 / 34,816 = 123,361.9
    assert rows["bf16"].tokens_vram == 32_768 and rows["bf16"].tokens_dram == 262_144
    assert rows["k8v4"].tokens_dram == 671_088  # 34,359,738,368 / 51,200 = 671,088.6


def test_head_dim_key_nested_text_config_and_tp():
    cfg = {"text_config": {"num_hidden_layers": 4, "num_attention_heads": 8, "head_dim": 256}}
    assert model_geometry(cfg) == ModelGeometry(4, 8, 256)
    assert ModelGeometry(32, 8, 128).per_rank(4) == ModelGeometry(32, 2, 128)
    assert ModelGeometry(32, 2, 128).per_rank(4) == ModelGeometry(32, 1, 128)  # replicated KV heads
    with pytest.raises(ValueError, match="num_hidden_layers"):
        model_geometry({"hidden_size": 4})


def test_cli_states_tier_sizes_per_rank_and_over_all_ranks(tmp_path, capsys):
    """Sizes are per rank: each of the ranks holds its KV heads' share of the same tokens, so a tier's tokens
    are one rank's and its bytes add up over the ranks (hand-computed: K8V4 at 4 of Llama-3-8B's 8 KV heads
    is 32·4·(132+68) = 25,600 bytes per token per rank)."""
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text("codec: k8v4\ntiers:\n  vram: 4GiB\n  dram: 100k tokens\n")
    args = ["plan", "--model", json.dumps(LLAMA3_8B), "--config", str(tiers), "--gpu-memory", "80GiB"]
    assert main([*args, "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "4 KV heads per rank (tensor parallel 2)" in out and "25,600" in out
    assert "tiers.vram = 4.00 GiB per rank: 167,772 tokens; over 2 ranks: 8.00 GiB, the same 167,772" in out
    assert "tiers.dram = 100,000 tokens: 2.38 GiB per rank; over 2 ranks: 4.77 GiB, the same 100,000" in out
    assert main(args) == 0  # one rank: no totals
    out = capsys.readouterr().out
    assert "tiers.vram = 4.00 GiB per rank: 83,886 tokens (with the configured codec)" in out
    assert "over" not in out
    assert main([*args, "--tp", "3"]) == 2
    assert "use a divisor or a multiple of 8" in capsys.readouterr().err


def test_configured_custom_codec_is_added():
    rows = plan_rows(ModelGeometry(2, 2, 64), GIB, GIB, KVCodecSpec(2, 4))
    assert rows[-1].configured and rows[-1].bytes_per_token == 2 * 2 * (16 + 4 + 32 + 4)


def test_cli_prints_the_table(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA3_8B))
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text("codec: tq4\ntiers:\n  vram: 4GiB\n  dram: 32GiB\n")
    assert main(["plan", "--model", str(model), "--config", str(tiers)]) == 0
    out = capsys.readouterr().out
    assert "TQ K4V4 (tq4) *" in out and "34,816" in out and "123,361" in out and "3.76x" in out
    assert load_model_config(json.dumps(SMOLLM2_135M))["num_hidden_layers"] == 30


def test_cli_token_sized_tiers_and_errors(tmp_path, capsys):
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text("codec: k8v4\ntiers:\n  vram: 100k tokens\n")
    assert main(["plan", "--model", json.dumps(LLAMA3_8B), "--config", str(tiers)]) == 0
    out = capsys.readouterr().out
    assert "(100,000)" in out and "tiers.vram = 100,000 tokens: 4.77 GiB per rank (with the configured" in out
    assert main(["plan", "--model", str(tmp_path / "nope")]) == 2
    assert "is not a config.json" in capsys.readouterr().err


# ---------------------------------------------------------------- tiers larger than the machine (issue 25)
def test_cli_warns_about_tiers_larger_than_the_machine_with_both_numbers(tmp_path, capsys):
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text("tiers:\n  vram: 100GiB\n  dram: 4TiB\n")
    args = ["plan", "--model", json.dumps(LLAMA3_8B), "--config", str(tiers)]
    assert main([*args, "--gpu-memory", "80GiB", "--host-memory", "64GiB"]) == 0  # a warning, not an error
    out, err = capsys.readouterr()
    assert "tokens in DRAM" in out
    vram, dram = err.splitlines()
    assert vram.startswith("tiercache plan: warning: tiers.vram = 100.00 GiB (107,374,182,400 bytes) per GPU")
    assert "the GPU's 80.00 GiB (85,899,345,920 bytes)" in vram and vram.endswith("lower tiers.vram")
    assert dram.startswith("tiercache plan: warning: tiers.dram = 4.00 TiB (4,398,046,511,104 bytes)")
    assert "64.00 GiB (68,719,476,736 bytes) of host memory" in dram and "refuses to start" in dram


def test_cli_checks_this_machine_by_default_and_states_the_defaults(monkeypatch, capsys):
    monkeypatch.delenv("TIERCACHE_CONFIG", raising=False)
    monkeypatch.setattr("tiercache.config.host_memory_bytes", lambda: 16 * GIB)
    monkeypatch.setattr("tiercache.config.device_memory_bytes", lambda: 2 * GIB)
    assert main(["plan", "--model", json.dumps(LLAMA3_8B)]) == 0
    out, err = capsys.readouterr()
    assert "tiers per rank: vram 4.00 GiB, dram 8.00 GiB  (built-in defaults)" in out
    assert err.count("warning") == 1 and "tiers.vram = 4.00 GiB" in err and "2.00 GiB (2,147,483,648" in err
    monkeypatch.setattr("tiercache.config.device_memory_bytes", lambda: None)
    assert main(["plan", "--model", json.dumps(LLAMA3_8B)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "tiers.vram not checked against GPU memory: no GPU here" in out


def test_memory_warnings_ranks_and_token_sizes():
    from tiercache.config import TierCacheConfig

    tiers = TierCacheConfig.from_dict({"tiers": {"vram": "100k tokens", "dram": "8GiB"}}).tiers
    assert memory_warnings(tiers, 51_200, 32 * GIB, 80 * GIB) == []
    (together,) = memory_warnings(tiers, 51_200, 16 * GIB, None, ranks=4)  # 4 × 8 GiB > 16 GiB > 8 GiB
    assert "8.00 GiB (8,589,934,592 bytes) per rank, × 4 ranks = 32.00 GiB (34,359,738,368 bytes)" in together
    assert "the ranks together do not fit" in together and "refuses" not in together
    (vram,) = memory_warnings(tiers, 51_200, None, 4 * GIB)
    assert vram.startswith("tiers.vram = 100,000 tokens = 4.77 GiB (5,120,000,000 bytes) with the configured")


def test_cli_bad_memory_flag(capsys):
    assert main(["plan", "--model", json.dumps(LLAMA3_8B), "--gpu-memory", "80 gigs"]) == 2
    assert capsys.readouterr().err.startswith("tiercache plan: --gpu-memory: ")


def test_cli_warns_about_a_tier_that_holds_no_block(tmp_path, capsys):
    """tiers.vram: 4 is 4 bytes: the engine refuses it, and plan says so before anyone starts one."""
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text("codec: k8v4\ntiers:\n  vram: 4\n  dram: 8GiB\n")
    assert main(["plan", "--model", json.dumps(LLAMA3_8B), "--config", str(tiers)]) == 0
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if "tiers.vram" in line]
    assert "tiers.vram = 4 B (4 bytes) holds 0 tokens, not one block of 16" in warning
    assert "give tiers.vram a size such as 4GiB" in warning


def test_cli_counts_the_disk_tier(tmp_path, capsys):
    """tiers.disk in tokens of the configured codec (K8V4 at Llama-3-8B's 8 KV heads: 51,200 bytes a token;
    1 GiB holds 20,971 of them)."""
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text(f"codec: k8v4\ntiers:\n  disk: {{path: {tmp_path}, size: 1GiB}}\n")
    args = ["plan", "--model", json.dumps(LLAMA3_8B), "--config", str(tiers), "--gpu-memory", "80GiB"]
    assert main(args) == 0
    assert f"tiers.disk per rank: 1.00 GiB at {tmp_path}: ~20,971 tokens" in capsys.readouterr().out


def test_decode_column_names_the_kernel_each_model_shape_gets():
    """Odd widths at head_dim 64 decode on the Gluon kernel where KV heads × bits is even (Llama-3.2-1B's 8
    heads), on the Triton kernel at SmolLM2's 3; even widths on Gluon at both."""
    capacity = KVCodecSpec(5, 3)
    llama_1b = by_name(plan_rows(ModelGeometry(16, 8, 64), GIB, GIB, capacity))
    smollm = by_name(plan_rows(ModelGeometry(30, 3, 64), GIB, GIB, capacity))
    assert llama_1b["capacity"].decode.startswith("Gluon") and smollm["capacity"].decode.startswith("Triton")
    assert llama_1b["balanced"].decode.startswith("Gluon") and smollm["balanced"].decode.startswith("Gluon")
