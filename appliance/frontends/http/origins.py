"""Requests a web page in a browser on the device may not make: cross-site and DNS rebinding.

A page of any site, open in a browser on the device (or on a machine that reaches it), can
send requests to `http://127.0.0.1:8000`. Without a preflight it may POST a body with a
"simple" Content-Type (text/plain, a form), which would unload models or load one with a
`file:` override (code, where the repository API is open). It cannot read the answers, but it
does not need to. A page may also rebind its own DNS name to 127.0.0.1 after it loaded: its
requests are then same-origin for the browser, and it can read the answers too; they carry
the page's name in `Host`.

So every HTTP request is checked, before anything else runs:

- `Host` must be an IP address (a rebinding needs a DNS name), `localhost`, one of this
  machine's names (its host name, short and with `.local`), the name the server listens on,
  or a name given with `--http-allowed-hosts`. Otherwise 403.
- A request other than GET / HEAD / OPTIONS that carries `Origin` (browsers send it on every
  such request) must come from the server's own origin: the Origin's host and port are the
  request's `Host`. Otherwise 403.
- A control POST (everything but inference) may not have a body typed `text/plain` or
  `multipart/form-data`, the types an HTML form sends in a browser that sends no `Origin`:
  415. `application/x-www-form-urlencoded` stays accepted: Triton's C++ client (libcurl's
  default, so perf_analyzer's shared memory registration) sends it on every control POST,
  with a JSON body; a form can only send an encoded body that is no JSON object, or an
  empty one, and the browsers that send forms without Origin are a decade old.

Triton's clients send no Origin and an IP or `localhost` in Host, so nothing changes for
them. `--http-allowed-hosts '*'` turns the checks off (a proxy in front that does them).

The Host check applies where the listener is the device's own (a loopback address or name,
the default), or where `--http-allowed-hosts` names the hosts. A server listening on the
network without that flag (a container's `--http-address=0.0.0.0`) is called by whatever
name the network gives it (a Compose service, a Kubernetes Service's DNS name), which this
server cannot know; there the Host check is off, as Jupyter's is for remote access, and the
Origin and Content-Type checks stay: anyone on that network could call the API anyway.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

# Methods a page may send cross-site whose answers it cannot read and that change nothing here.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The Content-Types an HTML form sends (the third simple one, urlencoded: see above).
FORM_TYPES = ("text/plain", "multipart/form-data")
HOSTS_REMEMBERED = 256


def _shown(text: str) -> str:
    return text[:80].encode("unicode_escape").decode("ascii")


def split_host(value: str) -> tuple[str, int | None]:
    """`name[:port]` or `[v6]:port` -> (lower-case name without a final dot, port or None);
    ('', None) when it cannot be read."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return "", None
        name, rest = value[1:end], value[end + 1 :]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return "", None
        return name.lower(), int(rest[1:]) if rest else None
    name, colon, port = value.rpartition(":")
    if not colon:
        name, port = value, ""
    elif not (port.isascii() and port.isdigit()):
        return "", None
    return name.lower().rstrip("."), int(port) if port else None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(address: str) -> bool:
    """Whether a listen address reaches only this machine (127.0.0.0/8, ::1, localhost)."""
    name = address.strip().strip("[]").lower().rstrip(".")
    if name in ("localhost", "localhost.localdomain") or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def machine_names() -> set[str]:
    """This machine's own names: its host name, short, and its mDNS `.local` name."""
    full = socket.gethostname().lower().rstrip(".")
    short = full.split(".")[0]
    return {name for name in (full, short, f"{short}.local") if name}


class RequestOrigins:
    """The Host, Origin and Content-Type checks for one HTTP listener."""

    def __init__(self, allowed_hosts: Iterable[str], listen_address: str, tls: bool) -> None:
        names = {name.strip().lower().rstrip(".") for name in allowed_hosts if name.strip()}
        self.off = "*" in names
        # Off on a network listener that names no hosts (the module's docstring).
        self._check_host = bool(names) or is_loopback(listen_address)
        self._names = {"localhost", "localhost.localdomain", *machine_names(), *names}
        if listen_address and not _is_ip(listen_address):
            self._names.add(listen_address.lower().rstrip("."))
        self._default_port = 443 if tls else 80
        # Host values seen -> whether allowed: every request asks, and parsing one costs
        # 10 us, more than the infer fast path's own work; bounded (a client sends few).
        self._hosts: dict[str, bool] = {}

    def host_allowed(self, name: str) -> bool:
        if self.off or not self._check_host or _is_ip(name):
            return True
        return name in self._names or name.endswith(".localhost")

    def _host_value_allowed(self, host: str) -> bool:
        allowed = self._hosts.get(host)
        if allowed is None:
            allowed = self.host_allowed(split_host(host)[0])
            if len(self._hosts) < HOSTS_REMEMBERED:
                self._hosts[host] = allowed
        return allowed

    def problem(
        self, method: str, host: str | None, origin: str | None, control: bool,
        content_type: str | None,
    ) -> tuple[int, str] | None:
        """(status, message) when the request is refused, else None. `control`: a POST of a
        control endpoint (not inference)."""
        if self.off:
            return None
        if host is not None and not self._host_value_allowed(host):
            return 403, (
                f"Host '{_shown(host)}' is not a name of this server: add it to "
                "--http-allowed-hosts (a web page that points its own DNS name at this device "
                "sends its name here)"
            )
        if (
            origin is not None
            and method not in SAFE_METHODS
            and not self._same_origin(origin, *split_host(host or ""))
        ):
            return 403, (
                f"cross-origin request refused: Origin '{_shown(origin)}' is not this "
                f"server's own (Host '{_shown(host or '')}'); a page of another site may not "
                "use this API"
            )
        if control and content_type is not None:
            media = content_type.split(";")[0].strip().lower()
            if media in FORM_TYPES:
                return 415, (
                    f"Content-Type '{_shown(media)}' is not accepted on this endpoint: send the "
                    "body as application/json (or with no Content-Type)"
                )
        return None

    def _same_origin(self, origin: str, host_name: str, host_port: int | None) -> bool:
        if not host_name:
            return False
        try:
            parts = urlsplit(origin.strip())
            origin_port = parts.port
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False  # "null" (a sandboxed page, a file), or no origin of the web
        port = origin_port or (443 if parts.scheme == "https" else 80)
        return parts.hostname.lower().rstrip(".") == host_name and port == (
            host_port or self._default_port
        )
