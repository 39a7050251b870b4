"""The response cache: keys, LRU order, byte bound."""

from __future__ import annotations

import numpy as np

from appliance.services.cache import ResponseCache, cache_key, entry_size


def outputs(nbytes: int) -> dict[str, np.ndarray]:
    return {"y": np.zeros(nbytes, dtype=np.uint8)}


def key(value: int) -> bytes:
    return cache_key("m", 1, [("x", np.array([value], dtype=np.int32))])


def test_key_depends_on_every_part() -> None:
    x = np.arange(4, dtype=np.int32)
    base = cache_key("m", 1, [("x", x)])
    assert base == cache_key("m", 1, [("x", x.copy())])
    assert base != cache_key("m", 2, [("x", x)])
    assert base != cache_key("n", 1, [("x", x)])
    assert base != cache_key("m", 1, [("x", x.reshape(2, 2))])
    assert base != cache_key("m", 1, [("x", x.astype(np.int64))])
    assert base != cache_key("m", 1, [("z", x)])
    text = np.array([b"a", b"bc"], dtype=object)
    assert cache_key("m", 1, [("s", text)]) != cache_key(
        "m", 1, [("s", np.array([b"ab", b"c"], dtype=object))]
    )


def test_hit_miss_and_lru_eviction() -> None:
    entry = entry_size(outputs(100))
    cache = ResponseCache(max_bytes=3 * entry)
    assert cache.get(key(1)) is None
    cache.put(key(1), outputs(100))
    cache.put(key(2), outputs(100))
    cache.put(key(3), outputs(100))
    assert cache.get(key(1)) is not None  # 1 is now the most recently used
    cache.put(key(4), outputs(100))  # evicts 2, the least recently used
    assert cache.get(key(2)) is None
    assert cache.get(key(1)) is not None
    assert cache.evictions == 1
    assert cache.used_bytes == 3 * entry
    assert (cache.hits, cache.misses) == (2, 2)


def test_response_larger_than_the_cache_is_not_stored() -> None:
    cache = ResponseCache(max_bytes=50)
    assert not cache.put(key(1), outputs(100))
    assert len(cache) == 0


def test_an_entry_counts_what_tritons_packed_response_holds() -> None:
    y = np.zeros((1, 16), dtype=np.float32)
    # Triton's packed entry: 4 + per output 8 + (4 + name) + (4 + datatype) + (4 + 8 * ndim)
    # + (8 + data): 4 + 2 * (8 + 11 + 8 + 20 + 72) for two [1, 16] FP32 outputs.
    assert entry_size({"OUTPUT0": y, "OUTPUT1": y}) == 242
    text = np.array([b"ab", b"c"], dtype=object)
    assert entry_size({"s": text}) == 4 + 8 + 5 + 9 + 12 + 8 + (4 + 2) + (4 + 1)


def test_a_tiny_budget_stores_no_response() -> None:
    # L0_response_cache's insertion failure: a 200-byte cache cannot hold the 128 bytes of
    # output of a two-output model once the entry's names, datatypes and shapes count.
    cache = ResponseCache(max_bytes=200)
    y = np.zeros((1, 16), dtype=np.float32)
    assert not cache.put(key(1), {"OUTPUT0": y, "OUTPUT1": y})
    assert len(cache) == 0
    assert cache.used_bytes == 0
