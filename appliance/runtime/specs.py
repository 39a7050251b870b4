"""Model specs: everything scheduling needs, read from a model's config once, at load.

This is the only module that reads scheduling fields (dynamic_batching, sequence_batching,
ensemble_scheduling, queue policies) from the config protobuf; schedulers get plain values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from appliance.common.errors import ConfigError
from appliance.common.model_config import ModelConfig, datatype_of
from appliance.common.protocol import model_config_pb2 as mc
from appliance.common.settings import SEQUENCE_IDLE_DEFAULT_US, SchedulingSettings
from appliance.scheduling.batcher import DynamicScheduler
from appliance.scheduling.contract import ModelScheduler
from appliance.scheduling.ensemble import (
    EnsemblePlan,
    EnsembleScheduler,
    EnsembleStep,
    StepRunner,
    decoupled_labels,
)
from appliance.scheduling.instances import InstanceWorker
from appliance.scheduling.policy import BatchPolicy
from appliance.scheduling.queues import DEFAULT_POLICY_KEY, QueuePolicy
from appliance.scheduling.ragged import BatchInputSpec, BatchShaping, ScatterSpec
from appliance.scheduling.rate_limiter import RateLimiter
from appliance.scheduling.sequence import Control, SequenceScheduler, SequenceSpec, StateSpec
from appliance.scheduling.stats import ModelStats
from edge_backends.datatypes import BY_TRITON


def build_scheduler(
    config: ModelConfig,
    label: str,
    workers: list[InstanceWorker],
    stats: ModelStats,
    settings: SchedulingSettings,
    rate_limiter: RateLimiter,
    ensemble: EnsemblePlan | None,
    run_step: StepRunner,
) -> ModelScheduler:
    """The scheduler the config asks for: ensemble, sequence, or dynamic / direct."""
    queue_size = settings.max_queue_size
    if config.HasField("dynamic_batching"):
        configured = config.dynamic_batching.default_queue_policy.max_queue_size
        queue_size = configured if configured > 0 else queue_size
    if ensemble is not None:
        stats.ensemble = True  # its failed requests are OTHER, as tritonserver counts them
        return EnsembleScheduler(label, ensemble, run_step, stats)
    if config.HasField("sequence_batching"):
        return SequenceScheduler(
            label, workers, sequence_spec(config, queue_size), stats, rate_limiter
        )
    levels, default_level, policies = queue_settings(config)
    return DynamicScheduler(
        label=label,
        workers=workers,
        policy=batch_policy(config),
        stats=stats,
        max_queue_size=queue_size,
        preserve_ordering=config.dynamic_batching.preserve_ordering,
        inline_budget_ns=settings.inline_budget_us * 1000,
        priority_levels=levels,
        default_priority_level=default_level,
        queue_policies=policies,
        rate_limiter=rate_limiter,
        max_queue_wait_ns=settings.max_queue_wait_ms * 1_000_000,
        queue_wait_executions=settings.max_queue_wait_executions,
    )


# ---- dynamic and direct ------------------------------------------------------------------------


def batch_policy(config: ModelConfig) -> BatchPolicy:
    dyn = config.dynamic_batching if config.HasField("dynamic_batching") else None
    if config.model_transaction_policy.decoupled:
        dyn = None  # a decoupled request streams its own responses: one request per execution
    return BatchPolicy(
        max_batch_size=int(config.max_batch_size),
        dynamic=dyn is not None,
        preferred_batch_sizes=tuple(dyn.preferred_batch_size) if dyn else (),
        max_queue_delay_ns=int(dyn.max_queue_delay_microseconds) * 1000 if dyn else 0,
    )


def _queue_policy(policy: Any) -> QueuePolicy:
    return QueuePolicy(
        max_queue_size=int(policy.max_queue_size),
        default_timeout_ns=int(policy.default_timeout_microseconds) * 1000,
        delay_on_timeout=policy.timeout_action == policy.DELAY,
        allow_timeout_override=bool(policy.allow_timeout_override),
    )


def queue_settings(config: ModelConfig) -> tuple[int, int, dict[int, QueuePolicy]]:
    """Priority levels, the default level and the queue policies from the config: the levels
    `priority_queue_policy` lists, and `DEFAULT_POLICY_KEY` for every other one (the count
    may be any uint64, as in Triton: nothing is made per level here)."""
    if not config.HasField("dynamic_batching"):
        return 0, 0, {}
    dyn = config.dynamic_batching
    levels = int(dyn.priority_levels)
    policies = {DEFAULT_POLICY_KEY: _queue_policy(dyn.default_queue_policy)}
    for level, policy in dyn.priority_queue_policy.items():
        policies[int(level)] = _queue_policy(policy)
    return levels, int(dyn.default_priority_level), policies


def batch_shaping(config: ModelConfig) -> BatchShaping:
    """The config's ragged inputs (`allow_ragged_batch`), `batch_input` and `batch_output`."""
    outputs = {o.name: o for o in config.output}
    return BatchShaping(
        ragged=frozenset(i.name for i in config.input if i.allow_ragged_batch),
        batch_inputs=tuple(
            BatchInputSpec(
                kind=mc.BatchInput.Kind.Name(b.kind),
                targets=tuple(b.target_name),
                dtype=BY_TRITON[datatype_of(b.data_type)].numpy,
                source=b.source_input[0],
            )
            for b in config.batch_input
        ),
        scatter=tuple(
            ScatterSpec(
                target,
                b.source_input[0],
                (-1, *(int(d) for d in outputs[target].dims)),
            )
            for b in config.batch_output
            for target in b.target_name
            if target in outputs and b.source_input
        ),
    )


# ---- sequence ----------------------------------------------------------------------------------


def sequence_spec(config: ModelConfig, max_waiting: int) -> SequenceSpec:
    batching = config.sequence_batching
    idle_us = int(batching.max_sequence_idle_microseconds) or SEQUENCE_IDLE_DEFAULT_US
    # Triton's slots per instance: max(1, max_batch_size), or the oldest strategy's
    # max_candidate_sequences when it is set.
    slots = max(1, int(config.max_batch_size))
    oldest = None
    if batching.HasField("oldest"):
        if batching.oldest.max_candidate_sequences > 0:
            slots = int(batching.oldest.max_candidate_sequences)
        # Triton batches each instance's sequences with a dynamic batcher of these settings.
        oldest = BatchPolicy(
            max_batch_size=int(config.max_batch_size),
            dynamic=config.max_batch_size > 0,
            preferred_batch_sizes=tuple(int(n) for n in batching.oldest.preferred_batch_size),
            max_queue_delay_ns=int(batching.oldest.max_queue_delay_microseconds) * 1000,
        )
    return SequenceSpec(
        max_batch_size=int(config.max_batch_size),
        idle_ns=idle_us * 1000,
        controls=tuple(controls_from_config(config)),
        states=tuple(states_from_config(config)),
        max_waiting=max_waiting,
        model_name=config.name,
        slots_per_instance=slots,
        oldest=oldest,
    )


def controls_from_config(config: ModelConfig) -> list[Control]:
    controls = []
    for entry in config.sequence_batching.control_input:
        for control in entry.control:
            kind = type(control).Kind.Name(control.kind).removeprefix("CONTROL_SEQUENCE_")
            dtype: np.dtype[Any]
            values: tuple[Any, Any]
            if control.int32_false_true:
                values = (control.int32_false_true[0], control.int32_false_true[1])
                dtype = np.dtype(np.int32)
            elif control.fp32_false_true:
                values = (control.fp32_false_true[0], control.fp32_false_true[1])
                dtype = np.dtype(np.float32)
            elif control.bool_false_true:
                values = (control.bool_false_true[0], control.bool_false_true[1])
                dtype = np.dtype(np.bool_)
            else:  # CORRID: the id itself, in the configured type
                values = (0, 1)
                datatype = BY_TRITON[datatype_of(control.data_type)]
                controls.append(Control(entry.name, kind, datatype.numpy, values, datatype.triton))
                continue
            controls.append(Control(entry.name, kind, dtype, values))
    return controls


def states_from_config(config: ModelConfig) -> list[StateSpec]:
    states = []
    for entry in config.sequence_batching.state:
        dtype = BY_TRITON[datatype_of(entry.data_type)].numpy
        # A variable (-1) dimension is 1 on a sequence's first request, as in Triton (core's
        # SequenceStates::Initialize); the model's state output sets the shape after that.
        dims = tuple(1 if d < 0 else int(d) for d in entry.dims)
        initial = None
        for init in entry.initial_state:
            if init.HasField("zero_data") or not init.data_file:
                shape = tuple(1 if d < 0 else int(d) for d in init.dims) or dims
                initial = np.zeros(shape, dtype=dtype)
        states.append(StateSpec(entry.input_name, entry.output_name, dtype, dims, initial))
    return states


# ---- ensemble ----------------------------------------------------------------------------------


def plan_from_config(config: ModelConfig) -> EnsemblePlan:
    """Check the ensemble's wiring; ConfigError names the step and tensor at fault."""
    where = f"ensemble '{config.name}'"
    if not config.ensemble_scheduling.step:
        raise ConfigError(f"{where}: ensemble_scheduling has no steps")
    inputs = tuple(i.name for i in config.input)
    outputs = tuple(o.name for o in config.output)
    producers: dict[str, int] = dict.fromkeys(inputs, -1)
    steps = []
    for index, step in enumerate(config.ensemble_scheduling.step):
        if not step.model_name:
            raise ConfigError(f"{where}: step {index} has no model_name")
        version = "" if step.model_version <= 0 else str(step.model_version)
        for model_output, tensor in step.output_map.items():
            if tensor in producers:
                raise ConfigError(
                    f"{where}: tensor '{tensor}' is produced twice (step {index} output "
                    f"'{model_output}')"
                )
            producers[tensor] = index
        steps.append(
            EnsembleStep(
                index, step.model_name, version, dict(step.input_map), dict(step.output_map)
            )
        )
    for step in steps:
        for model_input, tensor in step.inputs.items():
            if tensor not in producers:
                raise ConfigError(
                    f"{where}: step {step.index} ('{step.model_name}') input '{model_input}' "
                    f"reads tensor '{tensor}', which no ensemble input or step produces"
                )
    for name in outputs:
        if name not in producers:
            raise ConfigError(f"{where}: output '{name}' is not produced by any step")
    _check_acyclic(where, steps, producers)
    return EnsemblePlan(
        config.name,
        tuple(steps),
        inputs,
        outputs,
        batching=config.max_batch_size > 0,
        output_dims={o.name: tuple(int(d) for d in o.dims) for o in config.output},
        max_inflight_requests=int(config.ensemble_scheduling.max_inflight_requests),
    )


def _check_acyclic(where: str, steps: list[EnsembleStep], producers: dict[str, int]) -> None:
    done: set[int] = set()
    while len(done) < len(steps):
        ready = [
            s.index
            for s in steps
            if s.index not in done
            and all(producers[t] == -1 or producers[t] in done for t in s.inputs.values())
        ]
        if not ready:
            stuck = [s.index for s in steps if s.index not in done]
            raise ConfigError(f"{where}: steps {stuck} depend on each other (a cycle)")
        done.update(ready)


def with_decoupled_steps(
    plan: EnsemblePlan, config: ModelConfig, is_decoupled: Callable[[EnsembleStep], bool]
) -> EnsemblePlan:
    """The plan knowing which steps' models are decoupled (read once the step models are
    loaded), checked as Triton checks it; the ensemble's config then says it is decoupled,
    as Triton fills it in (its responses stream)."""
    decoupled = frozenset(step.index for step in plan.steps if is_decoupled(step))
    problem = decoupled_labels(plan, decoupled)
    if problem:
        raise ConfigError(problem)
    config.model_transaction_policy.decoupled = bool(decoupled)
    return dataclasses.replace(plan, decoupled_steps=decoupled)
