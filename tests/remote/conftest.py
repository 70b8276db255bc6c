"""The remote-tier tests use the `redis_server` fixture of tests/conftest.py (tests/redis_server.py)."""
