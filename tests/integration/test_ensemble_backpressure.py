"""ensemble_scheduling's max_inflight_requests on the real server: a decoupled producer ten
times faster than its consumer is held back, so the consumer never has more than the limit
of the ensemble's requests in flight (the largest batch its dynamic batcher could form, which
the consumer reports), every response still arrives in order, and the server's peak memory
stays flat over many responses (bench/ensemble_backpressure.py runs it for minutes)."""

from __future__ import annotations

from pathlib import Path

from bench.ensemble_backpressure import Stream, hwm_mib, write_repository
from tests.serverproc import ServerProcess

LIMIT = 3
ELEMENTS = 64 * 1024  # 256 KiB a response


def test_a_fast_producer_is_bounded_by_max_inflight_requests(tmp_path: Path) -> None:
    repository = write_repository(tmp_path / "models", LIMIT)
    with ServerProcess(repository, log_path=tmp_path / "server.log") as server:
        stream = Stream(server.grpc_url)
        try:
            stream.request(40, ELEMENTS)  # warm-up: arenas and buffers at their size
            seqs, peak = stream.responses()
            assert seqs == list(range(40))
            before = hwm_mib(server.proc.pid)
            stream.request(400, ELEMENTS)  # 100 MiB made, 4 s of consuming
            seqs, peak = stream.responses()
        finally:
            stream.close()
        assert seqs == list(range(400))
        assert 1 <= peak <= LIMIT  # never more of the consumer's requests in flight
        growth = hwm_mib(server.proc.pid) - before
        assert growth <= 10.0, f"the server's peak memory grew {growth:.1f} MiB"
