"""The remote tier: a store shared by engines, below DRAM, reached through LMCache's L2 adapters.

Provides (format.py and store.py; both sides of the process boundary use them):
    RemoteNamespace, encode_value, parse_header, HEADER_BYTES     the key and value format
    RemoteStore, open_store                                       LMCache L2 adapter calls with timeouts
"""
