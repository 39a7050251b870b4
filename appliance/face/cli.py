"""`edge-appliance serve | version | manifest | check | tune | pin | unpin | status | fleet |
oci`: the entry point, and the only place with signal handlers. The serve flags and the settings
they make are in serve_flags.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import faulthandler
import logging
import multiprocessing
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from appliance.common.settings import ServerSettings
from appliance.flags.parsing import Parser
from appliance.flags.serve import add_serve_flags, settings_from_args
from appliance.fleet import oci_push
from appliance.fleet import ops as fleet_ops
from appliance.ops import logs
from appliance.ops.notify import Notifier
from appliance.server.app import StartupError, serve_forever, start_line
from appliance.server.shutdown import FORCE_AFTER_S, Deadline, force_exit
from appliance.tools import check, pin
from appliance.tools import status as status_cli

__all__ = ["add_serve_flags", "build_parser", "main", "settings_from_args"]

log = logging.getLogger("appliance")


COMMANDS = (
    "serve", "version", "manifest", "check", "tune", "pin", "unpin", "status", "fleet", "oci"
)


class _PrintVersion(argparse.Action):
    """`--version` / `-V`: the version line and the build's, computed only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help=(
                "print the version and exit (`edge-appliance version`: also the backends and GPU)"
            ),
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from appliance.ops import buildinfo

        info = buildinfo.summary()
        print(f"edge-appliance {info['version']} (commit {info['commit']})")  # noqa: T201
        parser.exit(0)


def serve_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = (
        "Serve model repositories over KServe v2 HTTP and gRPC. Flags follow tritonserver's; "
        "the ones it has and this server ignores are accepted with a warning."
    )
    p.add_argument("-V", "--version", action=_PrintVersion)
    add_serve_flags(p)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="edge-appliance",
        description="Triton-compatible inference server for edge devices. "
        "Flags follow tritonserver's names.",
    )
    sub = parser.add_subparsers(dest="command")
    serve_parser(sub.add_parser("serve", help="serve a model repository (the default command)"))
    version_parser(sub.add_parser("version", help="print the version and build information"))
    manifest_parser(sub.add_parser("manifest", help="write (and sign) version manifests"))
    check.parser(sub.add_parser("check", help="validate model repositories offline"))
    from appliance.tools import tune

    tune.parser(sub.add_parser("tune", help="find a model's best configuration on this device"))
    pin.parser(sub.add_parser("pin", help="serve one version of a model alone (a rollback)"), False)
    pin.parser(sub.add_parser("unpin", help="follow a model's version policy again"), True)
    status_cli.parser(sub.add_parser("status", help="print the server's status (--watch)"))
    fleet_ops.parser(sub.add_parser("fleet", help="staged rollouts across a fleet of devices"))
    oci_push.parser(sub.add_parser("oci", help="push model folders to an OCI registry"))
    return parser


def version_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = (
        "Print the version, git commit, Python, the backends available and whether an NVIDIA "
        "GPU was found."
    )
    p.add_argument("--json", action="store_true", help="print it as one JSON object")
    p.add_argument(
        "--verify",
        action="store_true",
        help="check the build's signed record: every file and the SBOM against SHA256SUMS "
        "and its Ed25519 signature (exit 0: pass, 1: fail)",
    )
    p.add_argument(
        "--public-key",
        type=Path,
        metavar="PEM",
        help="with --verify: the key the build must be signed by (default: the build key "
        "embedded in the binary)",
    )
    p.add_argument("--build-dir", type=Path, metavar="DIR", help=argparse.SUPPRESS)  # tests
    return p


def version(argv: Sequence[str]) -> int:
    import json

    from appliance.ops import buildinfo

    args = version_parser(Parser(prog="edge-appliance version")).parse_args(list(argv))
    if args.verify:
        from appliance.tools import build_check

        return build_check.verify_command(args)
    info = buildinfo.build_info()
    print(json.dumps(info, indent=2) if args.json else buildinfo.render(info))  # noqa: T201
    return 0


def manifest_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = (
        "Write SHA256SUMS for each version folder, listing every file in it; with --sign-key, "
        "also SHA256SUMS.sig (what --manifest-public-key checks). A model folder (a name that "
        "is not a version number) gets its model-level manifest (config.pbtxt and every other "
        "file beside the version folders) and one in each of its version folders."
    )
    p.add_argument(
        "folders",
        nargs="+",
        type=Path,
        metavar="VERSION_OR_MODEL_DIR",
        help="version folders (1, 2, ...) or model folders (all their versions)",
    )
    p.add_argument("--sign-key", type=Path, metavar="PEM", help="Ed25519 private key")
    return p


def manifest(argv: Sequence[str]) -> int:
    from appliance.repository.local import list_versions
    from appliance.repository.manifest import (
        ManifestError,
        load_private_key,
        write_manifest,
        write_model_manifest,
    )

    args = manifest_parser(Parser(prog="edge-appliance manifest")).parse_args(list(argv))
    try:
        key = load_private_key(args.sign_key) if args.sign_key else None
        for folder in args.folders:
            if folder.is_dir() and not folder.resolve().name.isdigit():  # a model folder
                written = [write_model_manifest(folder, key)]
                written += [write_manifest(folder / str(v), key) for v in list_versions(folder)]
            else:
                written = [write_manifest(folder, key)]
            for path in written:
                print(f"wrote {path}" + (" and its signature" if key else ""))  # noqa: T201
    except ManifestError as exc:
        print(f"edge-appliance manifest: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    return 0


class ExitSignals:
    """SIGTERM / SIGINT for `serve`: the first starts the shutdown, a second exits at once.

    `on_first(name)` runs on the event loop (send STOPPING=1 there); `wait()` returns the
    deadline, which starts when the signal arrives. From then on a backstop thread ends the
    process FORCE_AFTER_S past the deadline if it is still running (appliance/server/shutdown.py).

    Process-level handlers (`signal.signal`), not the event loop's: a second signal works
    while the loop is busy, stuck or already closed, and the forced exit runs on a thread of
    its own, so the handler never logs in the middle of a log call it interrupted.
    """

    def __init__(self, timeout_s: float, on_first: Callable[[str], None] = lambda _: None):
        self.timeout_s = timeout_s
        self.deadline: Deadline | None = None
        self.signal_name = ""
        self._on_first = on_first
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._forcing = False

    def install(self) -> None:
        """Take SIGTERM and SIGINT (call on the main thread, with the loop running)."""
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        # SIGHUP's default ends the process with no drain (a closed terminal, `kill -HUP`,
        # a `systemctl reload` someone adds): services read it as "reload", and this server
        # reloads nothing from its command line, so it is logged and ignored.
        signal.signal(signal.SIGHUP, self._hangup)

    def _hangup(self, signum: int, frame: FrameType | None) -> None:
        loop = self._loop
        if loop is not None:  # logged on the loop: this handler may interrupt a log call
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(
                    log.info,
                    "SIGHUP: ignored (nothing to reload: the model repository is followed by "
                    "--model-control-mode; stop with SIGTERM)",
                )

    async def wait(self) -> Deadline:
        await self._event.wait()
        assert self.deadline is not None
        return self.deadline

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.deadline is not None:
            if self._forcing:
                return
            self._forcing = True
            # A thread of its own: this handler may have interrupted a log call mid-write.
            threading.Thread(
                target=force_exit,
                args=(f"second signal ({name}) during shutdown: exiting now",),
                name="forced-exit",
                daemon=True,
            ).start()
            return
        self._start(name)
        loop = self._loop
        if loop is not None:
            # A closed loop: the server is already on its way out.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._begin)

    def _start(self, name: str) -> None:
        self.signal_name = name
        self.deadline = Deadline.starting(self.timeout_s)
        threading.Thread(
            target=self._enforce, args=(self.deadline,), name="shutdown-backstop", daemon=True
        ).start()

    def _begin(self) -> None:
        self._on_first(self.signal_name)
        self._event.set()

    @staticmethod
    def _enforce(deadline: Deadline) -> None:
        while (left := deadline.until_force_s(time.monotonic())) > 0:
            time.sleep(left)  # a daemon thread: it ends with the process
        force_exit(
            f"shutdown still not finished {FORCE_AFTER_S:g} s after its "
            f"{deadline.timeout_s:g} s deadline: exiting now"
        )


def _install_event_loop_policy() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _serve(settings: ServerSettings, log_settings: logs.LogSettings) -> int:
    notifier = Notifier.from_env()
    timeout_s = settings.exit_timeout_secs

    def on_first_signal(name: str) -> None:
        notifier.stopping_now()  # systemd hears it before draining starts
        log.info(
            "%s: shutting down within %g s (--exit-timeout-secs; forced at %g s); "
            "a second signal exits at once",
            name,
            timeout_s,
            timeout_s + FORCE_AFTER_S,
        )

    # First SIGTERM / SIGINT: the orderly shutdown; a second one, or the backstop past the
    # deadline, ends the process at once.
    signals = ExitSignals(timeout_s, on_first_signal)
    signals.install()
    try:
        await serve_forever(settings, signals.wait, notifier, log_settings)
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        notifier.send(f"STATUS=cannot start: {exc}", wait_s=1.0)
        return exc.exit_code  # 78 for a configuration error: systemd does not retry it
    finally:
        notifier.close()
    return 0


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one (systemd starts services at 1024 soft,
    524288 hard: a few hundred connections and shared memory regions would exhaust 1024, after
    which every new connection fails). The limits now, (soft, hard); logged when raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
        return soft, hard
    log.info("open-file limit raised from %d to %d (RLIMIT_NOFILE)", soft, hard)
    return hard, hard


def serve(argv: Sequence[str]) -> int:
    # A hang the watchdog ends with SIGABRT leaves every thread's stack in the journal.
    faulthandler.enable()
    parser = serve_parser(Parser(prog="edge-appliance serve"))
    settings = settings_from_args(parser.parse_args(list(argv)))
    log_settings = logs.LogSettings(logs.LogState.from_settings(settings))
    try:
        log_settings.install()
    except OSError as exc:
        raise SystemExit(
            f"edge-appliance: cannot open --log-file {settings.log_file}: {exc.strerror}"
        ) from None
    log.info("%s", start_line(settings))  # the log's first line: what runs, and where
    for flag in settings.ignored_flags:
        log.warning("%s is a tritonserver flag that edge-appliance ignores", flag)
    raise_open_file_limit()
    _install_event_loop_policy()
    return asyncio.run(_serve(settings, log_settings))


def main(argv: Sequence[str] | None = None) -> int:
    # Python models run in spawned processes; in a one-file build the binary re-enters here.
    multiprocessing.freeze_support()
    args = list(sys.argv[1:] if argv is None else argv)
    # `edge-appliance --model-repository ...` (tritonserver's spelling) means serve.
    if not args or (args[0].startswith("-") and args[0] not in ("-h", "--help")):
        return serve(args)
    if args[0] == "version":
        return version(args[1:])
    if args[0] == "serve":
        return serve(args[1:])
    if args[0] == "manifest":
        return manifest(args[1:])
    if args[0] == "check":
        return check.main(args[1:])
    if args[0] in ("pin", "unpin"):
        return pin.main(args)
    if args[0] == "status":
        return status_cli.main(args[1:])
    if args[0] == "fleet":
        return fleet_ops.main(args[1:])
    if args[0] == "oci":
        return oci_push.main(args[1:])
    if args[0] == "tune":
        from appliance.tools import tune  # loads the server path only when tuning

        return tune.main(args[1:])
    if args[0] in ("-h", "--help"):
        build_parser().parse_args(args)
    close = difflib.get_close_matches(args[0], COMMANDS, n=2)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    print(  # noqa: T201
        f"usage: edge-appliance [COMMAND] [FLAGS]\nedge-appliance: error: unknown command "
        f"{args[0]!r}{hint}; commands: {', '.join(COMMANDS)}\n(see edge-appliance --help)",
        file=sys.stderr,
    )
    return 2
