"""The remote tier: a store shared by engines, below DRAM, reached through LMCache's L2 adapters.

Provides (both sides of the process boundary use them):
    format.py     RemoteNamespace, encode_value, sign_value, parse_header, RemoteMiss, HEADER_BYTES
                  the key and value format (a keyed MAC when tiers.remote.secret is set)
    store.py      RemoteStore, open_store: LMCache L2 adapter calls with timeouts, a bad value costing its
                  block only (connection.py: the adapter and its reconnects; loads.py: get, per value)
    secret.py     RemoteSecret, read_secret: tiers.remote.secret, never shown
    settings.py   check_adapter, host_problem: what LMCache's adapters accept, checked at config load
    lmcache_api.py   the LMCache names the store uses
"""
