"""The TLS files named on the command line, checked before a listener uses them.

Each file must be readable and hold what its flag says: PEM certificates, or an unencrypted
private key; the key must be the certificate's. A failure names the flag, the file and what is
wrong with it, where gRPC would say "Failed to bind to address" (which reads like a port
conflict) and OpenSSL "PEM lib". Only the standard library's `ssl` (OpenSSL) parses here, so
the check needs no optional package; gRPC's BoringSSL reads the same PEM formats.
"""

from __future__ import annotations

import base64
import binascii
import re
import ssl

_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.DOTALL)
_LEGACY_ENCRYPTED = re.compile(rb"Proc-Type:\s*4,ENCRYPTED")  # OpenSSL's traditional format


class TlsFileError(ValueError):
    """A TLS file that cannot be used; the message says which and why."""


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise TlsFileError(f"{flag} '{path}': cannot read it: {exc.strerror}") from None
    if not data.strip():
        raise TlsFileError(f"{flag} '{path}': the file is empty")
    return data


def _blocks(data: bytes) -> list[tuple[str, bytes]]:
    """(label, body) of each PEM block: ('CERTIFICATE', b'MIIB...')."""
    return [(label.decode(), body) for label, body in _BLOCK.findall(data)]


def _holds(blocks: list[tuple[str, bytes]]) -> str:
    if not blocks:
        return (
            "it holds no PEM block ('-----BEGIN ...-----'); a DER file converts with "
            "`openssl x509 -inform der` (a certificate) or `openssl pkey -inform der` (a key)"
        )
    return "it holds " + ", ".join(sorted({f"a {label}" for label, _ in blocks}))


def _der(body: bytes) -> bytes | None:
    """A PEM block's body decoded, or None if it is not base64 (or has headers)."""
    try:
        return base64.b64decode(b"".join(body.split()), validate=True)
    except (binascii.Error, ValueError):
        return None


def certificates(path: str, flag: str) -> bytes:
    """The PEM file's bytes, once every certificate in it parses."""
    data = _read(path, flag)
    blocks = _blocks(data)
    bodies = [body for label, body in blocks if label == "CERTIFICATE"]
    if not bodies:
        raise TlsFileError(f"{flag} '{path}': no certificate in it ({_holds(blocks)})")
    for number, body in enumerate(bodies, 1):
        which = "the certificate" if len(bodies) == 1 else f"certificate {number} of {len(bodies)}"
        der = _der(body)
        if der is None:
            raise TlsFileError(f"{flag} '{path}': {which} in it is not valid base64")
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=der)
        except ssl.SSLError as exc:
            raise TlsFileError(
                f"{flag} '{path}': {which} in it does not parse as X.509 ({exc.reason or exc})"
            ) from None
    return data


def private_key(path: str, flag: str) -> bytes:
    """The PEM file's bytes, once it holds one unencrypted private key block."""
    data = _read(path, flag)
    blocks = _blocks(data)
    keys = [(label, body) for label, body in blocks if label.endswith("PRIVATE KEY")]
    if not keys:
        raise TlsFileError(f"{flag} '{path}': no private key in it ({_holds(blocks)})")
    label, body = keys[0]
    if label == "ENCRYPTED PRIVATE KEY" or _LEGACY_ENCRYPTED.search(body):
        raise TlsFileError(
            f"{flag} '{path}': the private key is encrypted with a passphrase, which the server "
            "cannot be given; decrypt it (`openssl pkey -in KEY -out PLAIN`) into a file only "
            "the service can read"
        )
    if _der(body) is None:
        raise TlsFileError(f"{flag} '{path}': the private key in it is not valid base64")
    return data


def _no_passphrase() -> bytes:
    raise TlsFileError("encrypted")  # checked above; never prompt on a terminal


def key_pair(cert_path: str, cert_flag: str, key_path: str, key_flag: str) -> tuple[bytes, bytes]:
    """The certificate chain's and the key's PEM bytes, once the key is the certificate's."""
    cert = certificates(cert_path, cert_flag)
    key = private_key(key_path, key_flag)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            cert_path, key_path, password=_no_passphrase
        )
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsFileError(
                f"{key_flag} '{key_path}' is not the private key of the certificate in "
                f"{cert_flag} '{cert_path}' (the first certificate there must be the server's "
                "own)"
            ) from None
        raise TlsFileError(
            f"{key_flag} '{key_path}': the private key does not parse ({exc.reason or exc})"
        ) from None
    except OSError as exc:  # replaced since it was read
        raise TlsFileError(f"{key_flag} '{key_path}': cannot read it: {exc.strerror}") from None
    return cert, key
