"""What shadow probation's mirroring costs the device (issue 39): CPU per client request with 0%,
10% and 100% of the requests mirrored to a target beside the served version.

    python -m bench.shadow_cost [--model squeezenet_onnx] [--requests 300] [--rounds 3]
        [--concurrency 1]

In-process, no sockets: the runtime loads the model twice (the served version and the target,
the same file: the worst case for agreement checks, every output compared), the inference
service answers `--requests` requests per round from the served version, and a ShadowTrial
(runtime/shadow.py, with output agreement on: max_abs_diff and top-1) takes the share. A round's
figure is the process CPU time (every thread: ONNX Runtime's too) over its client requests, once
the mirrored requests it started have finished; the table gives each share's median over the
rounds and the overhead against 0%.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from appliance.common.settings import ServerSettings
from appliance.common.types import InferRequest, Tensor
from appliance.repository.rollout_policy import ShadowRule
from appliance.runtime.models import ModelRuntime
from appliance.runtime.settings import RuntimeSettings
from appliance.runtime.shadow import ShadowTrial
from appliance.services.inference import InferenceService
from configs.generate import IMAGE_CONFIG, light_model, save

SHARES = (0.0, 0.1, 1.0)
MODELS = {"squeezenet_onnx": ("light_squeezenet", "softmaxout_1", "data_0", (1, 3, 224, 224))}


Results = dict[float, list[tuple[float, int]]]  # share -> (CPU s per request, mirrored) a round


async def _run(model: str, requests: int, rounds: int, concurrency: int) -> Results:
    light, output, input_name, shape = MODELS[model]
    results: Results = {share: [] for share in SHARES}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in (model, f"{model}_shadow"):
            save(light_model(light), root / name / "1" / "model.onnx")
            (root / name / "config.pbtxt").write_text(
                IMAGE_CONFIG.format(name=name, output=output, batching="")
            )
            (root / name / "labels.txt").write_text("".join(f"c{i}\n" for i in range(1000)))
        settings = RuntimeSettings.from_server(ServerSettings(model_repositories=(root,)))
        runtime = ModelRuntime(settings)
        service = InferenceService(runtime)
        await runtime.load_all()
        try:
            served = runtime.get(model, "")
            shadow = runtime.get(f"{model}_shadow", "")
            data = np.random.default_rng(0).random(shape, dtype=np.float32)
            request = InferRequest(model, inputs=[Tensor(input_name, "FP32", shape, data)])
            for _ in range(20):  # warm both
                await service.infer(request)
                await service.infer(InferRequest(f"{model}_shadow", inputs=request.inputs))
            total = requests // concurrency * concurrency

            async def client(count: int) -> None:
                for _ in range(count):
                    await service.infer(request)

            for _ in range(rounds):
                for share in SHARES:
                    trial = None
                    if share:
                        rule = ShadowRule(
                            share=share, requests=10**9, max_abs_diff=1.0, min_top1_agreement=0.5
                        )
                        trial = ShadowTrial(model, shadow, rule, [served], lambda t, why: None)
                        served.mirror = trial
                    cpu = time.process_time()
                    clients = (client(total // concurrency) for _ in range(concurrency))
                    await asyncio.gather(*clients)
                    while trial is not None and trial.in_flight:  # noqa: ASYNC110  # a bench
                        await asyncio.sleep(0.005)
                    mirrored = trial.mirrored if trial is not None else 0
                    results[share].append(((time.process_time() - cpu) / total, mirrored))
                    served.mirror = None
        finally:
            await runtime.stop(5)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="squeezenet_onnx", choices=sorted(MODELS))
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    results = asyncio.run(_run(args.model, args.requests, args.rounds, args.concurrency))
    base = statistics.median(cpu for cpu, _ in results[0.0])
    print(
        "| model | share | mirrored per round | CPU ms per client request | overhead | rounds |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for share, values in results.items():
        median = statistics.median(cpu for cpu, _ in values)
        print(
            f"| {args.model} | {share:.0%} | {'/'.join(str(m) for _, m in values)} of "
            f"{args.requests} | {median * 1000:.2f} | {(median / base - 1) * 100:+.0f}% | "
            f"{'/'.join(f'{cpu * 1000:.2f}' for cpu, _ in values)} |"
        )


if __name__ == "__main__":
    main()
