"""`edge-appliance serve | version | manifest | check | tune`: the entry point, and the only
place with signal handlers. The serve flags and the settings they make are in serve_flags.py.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import multiprocessing
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from appliance import check, logs
from appliance.app import StartupError, serve_forever
from appliance.notify import Notifier
from appliance.serve_flags import add_serve_flags, settings_from_args
from appliance.settings import ServerSettings

__all__ = ["add_serve_flags", "build_parser", "main", "settings_from_args"]

log = logging.getLogger("appliance")

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-appliance",
        description="Triton-compatible inference server for edge devices. "
        "Flags follow tritonserver's names.",
    )
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="serve a model repository (the default command)")
    add_serve_flags(serve)
    version_parser(sub.add_parser("version", help="print the version and build information"))
    manifest_parser(sub.add_parser("manifest", help="write (and sign) version manifests"))
    check.parser(sub.add_parser("check", help="validate model repositories offline"))
    sub.add_parser("tune", help="find a model's best configuration on this device")
    return parser


def version_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = (
        "Print the version, git commit, Python, the backends available and whether an NVIDIA "
        "GPU was found."
    )
    p.add_argument("--json", action="store_true", help="print it as one JSON object")
    return p


def version(argv: Sequence[str]) -> int:
    import json

    from appliance import buildinfo

    args = version_parser(argparse.ArgumentParser(prog="edge-appliance version")).parse_args(
        list(argv)
    )
    info = buildinfo.build_info()
    print(json.dumps(info, indent=2) if args.json else buildinfo.render(info))  # noqa: T201
    return 0


def manifest_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = (
        "Write SHA256SUMS for each version folder, listing every file in it; with --sign-key, "
        "also SHA256SUMS.sig (what --manifest-public-key checks)."
    )
    p.add_argument("folders", nargs="+", type=Path, metavar="VERSION_DIR")
    p.add_argument("--sign-key", type=Path, metavar="PEM", help="Ed25519 private key")
    return p


def manifest(argv: Sequence[str]) -> int:
    from appliance.repository.manifest import ManifestError, load_private_key, write_manifest

    args = manifest_parser(argparse.ArgumentParser(prog="edge-appliance manifest")).parse_args(
        list(argv)
    )
    try:
        key = load_private_key(args.sign_key) if args.sign_key else None
        for folder in args.folders:
            written = write_manifest(folder, key)
            print(f"wrote {written}" + (" and its signature" if key else ""))  # noqa: T201
    except ManifestError as exc:
        print(f"edge-appliance manifest: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    return 0


def _install_event_loop_policy() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _serve(settings: ServerSettings, log_settings: logs.LogSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    notifier = Notifier.from_env()
    signals_seen = 0

    def on_signal() -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:  # a second signal forces the exit
            log.warning("second signal: exiting now")
            raise SystemExit(1)
        notifier.stopping_now()  # systemd hears it before draining starts
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await serve_forever(settings, stop, notifier, log_settings)
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        notifier.send(f"STATUS=cannot start: {exc}", wait_s=1.0)
        return 1
    finally:
        notifier.close()
    return 0


def serve(argv: Sequence[str]) -> int:
    # A hang the watchdog ends with SIGABRT leaves every thread's stack in the journal.
    faulthandler.enable()
    parser = argparse.ArgumentParser(prog="edge-appliance serve")
    add_serve_flags(parser)
    settings = settings_from_args(parser.parse_args(list(argv)))
    log_settings = logs.LogSettings(
        logs.LogState(
            log_file=settings.log_file,
            log_info=settings.log_info,
            log_warning=settings.log_warning,
            log_error=settings.log_error,
            log_verbose_level=settings.log_verbose,
            log_format=settings.log_format,
        )
    )
    try:
        log_settings.install()
    except OSError as exc:
        raise SystemExit(
            f"edge-appliance: cannot open --log-file {settings.log_file}: {exc.strerror}"
        ) from None
    for flag in settings.ignored_flags:
        log.warning("%s is a tritonserver flag that edge-appliance ignores", flag)
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
    if args[0] == "tune":
        from appliance import tune  # loads the server path only when tuning

        return tune.main(args[1:])
    build_parser().parse_args(args)
    return 2
