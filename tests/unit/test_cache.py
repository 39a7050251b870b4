"""The response cache: keys, LRU order, byte bound."""

from __future__ import annotations

import numpy as np

from appliance.services.cache import ResponseCache, cache_key


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
    cache = ResponseCache(max_bytes=300)
    assert cache.get(key(1)) is None
    cache.put(key(1), outputs(100))
    cache.put(key(2), outputs(100))
    cache.put(key(3), outputs(100))
    assert cache.get(key(1)) is not None  # 1 is now the most recently used
    cache.put(key(4), outputs(100))  # evicts 2, the least recently used
    assert cache.get(key(2)) is None
    assert cache.get(key(1)) is not None
    assert cache.evictions == 1
    assert cache.used_bytes == 300
    assert (cache.hits, cache.misses) == (2, 2)


def test_response_larger_than_the_cache_is_not_stored() -> None:
    cache = ResponseCache(max_bytes=50)
    assert not cache.put(key(1), outputs(100))
    assert len(cache) == 0
