"""What a rollout that runs itself costs in bucket requests (issue 39), per device and poll.

    python -m bench.fleet_auto [--devices 4] [--seconds 20]

Real devices (SeaweedFS, each behind a link that counts its S3 requests by kind, as the fleet
test does; FLEET_POLL_S sets the poll, 1 s by default) through four phases of the same rollout
of version 2, every device in its stage and serving the target:

1. manual: `advance: manual`, stage 0 of 2 (the devices list the verdicts every poll, as today);
2. auto: the same with `advance: auto` and a soak of an hour (the stage waits);
3. budget: a new target 3 with a budget of 1 device and no traffic (the slot holder's probation
   never ends): the others wait for a slot;
4. window: target 3 held by a closed switch window (downloaded ahead).

Each phase prints the requests per device and poll by kind; per hour at a 60 s poll is 60 x that.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from appliance.repository import rollout
from tests.integration.test_fleet import POLL_S, Device, wait_for
from tests.integration.test_s3_repository import CONFIG, Bucket
from tests.s3servers import seaweed_server


def _document(bucket: Bucket, **fields: Any) -> None:
    raw: dict[str, Any] = {
        "format": 1,
        "model": "m",
        "revision": 1,
        "target": 2,
        "baseline": 1,
        "stages": [{"percent": 100}, {"percent": 100}],
        "stage": 0,
        "probation": {"window_requests": 2, "max_error_rate": 0.5},
        "halt": {"max_failed_share": 0.5, "min_verdicts": 1},
    }
    raw.update(fields)
    bucket.put("m/rollout.json", rollout.RolloutDocument.parse(json.dumps(raw).encode()).to_json())


def _phase(devices: list[Device], seconds: float) -> Counter[str]:
    for device in devices:
        device.link.take()
    time.sleep(seconds)
    total: Counter[str] = Counter()
    for device in devices:
        total.update(device.link.take())
    polls = seconds / POLL_S * len(devices)
    return Counter({kind: round(n / polls, 3) for kind, n in total.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, seaweed_server(Path(tmp)) as s3:
        bucket = Bucket(s3)
        bucket.put("m/config.pbtxt", CONFIG.encode())
        for version, value in ((1, 1), (2, 2), (3, 3)):
            bucket.put_version(version, value)
        devices = [Device(i, s3, bucket, Path(tmp)) for i in range(args.devices)]
        try:
            for device in devices:
                device.proc.wait_ready(timeout_s=180)
            _document(bucket)
            wait_for("all on v2", lambda: all(d.serves(2.0) for d in devices))
            for _ in range(3):  # their probations pass
                for device in devices:
                    device.value()
            time.sleep(3)
            print("manual", dict(_phase(devices, args.seconds)))
            _document(
                bucket,
                revision=2,
                advance="auto",
                stages=[{"percent": 100, "soak_s": 3600}, {"percent": 100}],
            )
            time.sleep(3)
            print("auto, waiting on its soak", dict(_phase(devices, args.seconds)))
            _document(bucket, revision=3, target=3, baseline=2, budget={"max_devices": 1})
            time.sleep(3)
            print("budget 1, the others waiting", dict(_phase(devices, args.seconds)))
            hour = (time.localtime().tm_hour + 2) % 24
            _document(
                bucket,
                revision=4,
                target=3,
                baseline=2,
                windows=[{"switch": f"{hour:02d}:00-{(hour + 1) % 24:02d}:00"}],
            )
            time.sleep(3)
            print("switch window closed", dict(_phase(devices, args.seconds)))
        finally:
            for device in devices:
                device.proc.stop()
                device.link.stop()


if __name__ == "__main__":
    main()
