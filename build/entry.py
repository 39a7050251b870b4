"""The frozen binary's entry point: `edge-appliance [serve|version|manifest|check] ...`."""

import os

# Before onnxruntime is imported anywhere: a device must not phone home.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from appliance.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
