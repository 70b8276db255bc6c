"""A config with tiers.remote is refused when the connector starts: the remote tier's store exists, but the
connector does not look blocks up in it or write them yet, and serving without it must not be silent."""

from __future__ import annotations

import pytest
from helpers import connector_config, engine


def test_an_engine_with_a_remote_tier_refuses_to_start_naming_the_key(tiny_model):
    config = connector_config("none")
    config["kv_connector_extra_config"]["tiers"]["remote"] = {"url": "redis://127.0.0.1:6379"}
    with pytest.raises(Exception, match=r"tiers\.remote.*remove tiers\.remote"), engine(tiny_model, config):
        pass
