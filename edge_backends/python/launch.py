"""How a Python model's process starts: spawned, without the server's `__main__` and without
multiprocessing's resource tracker.

Plain `spawn` does two things a model process does not need. It re-runs the parent's main
module in the child (as `__mp_main__`): for `edge-appliance serve` that is the console script,
whose `from appliance.face.cli import main` imports the whole server (aiohttp, grpc, protobuf) into
every model process. And it starts multiprocessing's resource tracker, a process of its own,
so that every process can register shared memory with it. Measured with bench/idle_memory.py on
the example repository (three Python model instances): each model process 68 MiB RSS with the
server's modules, 37 MiB without; the tracker 13 MiB. The tensor arenas (shm.py) own their
segments' lifetime themselves, so no tracker is needed.

Everything else is multiprocessing's spawn as it is: the same command line (a one-file or
one-folder binary re-enters through `multiprocessing.freeze_support()`), `sys.path`, working
folder and authkey; connections and shared values passed as inherited descriptors; and the
`Process` objects are multiprocessing's, so `multiprocessing.active_children()` sees them (the
shutdown's last resort kills them).
"""

from __future__ import annotations

import io
import os
from multiprocessing import context, popen_spawn_posix, reduction, spawn, util
from multiprocessing.process import BaseProcess
from typing import Any

# The preparation keys that make the child import the parent's main module.
_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


class _Popen(popen_spawn_posix.Popen):
    """popen_spawn_posix.Popen's launch, minus the resource tracker and the main module."""

    _fds: list[int]  # what the child inherits (popen_spawn_posix.Popen's own list)

    def _launch(self, process_obj: BaseProcess) -> None:
        prep_data: dict[str, Any] = spawn.get_preparation_data(process_obj.name)
        for key in _MAIN_KEYS:
            prep_data.pop(key, None)
        payload = io.BytesIO()
        context.set_spawning_popen(self)  # connections and values pickle as inherited fds
        try:
            reduction.dump(prep_data, payload)
            reduction.dump(process_obj, payload)
        finally:
            context.set_spawning_popen(None)
        parent_r, child_w = os.pipe()  # the child holds child_w open: EOF is its exit
        child_r, parent_w = os.pipe()
        try:
            command = spawn.get_command_line(pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            self.pid = util.spawnv_passfds(os.fsencode(spawn.get_executable()), command, self._fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as pipe:
                pipe.write(payload.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, _close, (parent_r, parent_w))
            os.close(child_r)
            os.close(child_w)


class ModelProcess(context.SpawnProcess):
    """A spawned process that imports only what its target needs."""

    @staticmethod
    def _Popen(process_obj: BaseProcess) -> _Popen:
        return _Popen(process_obj)


class ModelContext(context.SpawnContext):
    """The spawn context whose processes start through `ModelProcess`."""

    Process = ModelProcess


CONTEXT = ModelContext()
