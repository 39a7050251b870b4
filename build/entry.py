"""The frozen binary's entry point: `edge-appliance [serve|version|manifest|check] ...`."""

import multiprocessing
import os

# Before onnxruntime is imported anywhere: a device must not phone home.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

if __name__ == "__main__":
    # A Python model's process is this binary re-executed: it must branch off here, before
    # the server's imports (aiohttp, grpc, onnxruntime), which it does not need.
    multiprocessing.freeze_support()
    from appliance.face.cli import main

    raise SystemExit(main())
