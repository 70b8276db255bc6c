"""Block-relationship graph and background eviction advisor, importable as tiercache.graph."""
