"""appliance/server/tls.py: every TLS file is checked before use, and a failure names the flag, the
file and what is wrong (issue 17, item 10); TlsSettings.problem() refuses half a TLS setup."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from appliance.common.settings import TlsSettings
from appliance.server.tls import TlsFileError, certificates, key_pair, private_key
from tests.pki import encrypted_copy, self_signed


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("pki"), "server")


def _refusal(call, *args: str) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(TlsFileError) as info:
        call(*args)
    return str(info.value)


def test_a_good_pair_is_returned_as_read(pair: tuple[Path, Path]) -> None:
    cert, key = pair
    assert key_pair(str(cert), "--c", str(key), "--k") == (cert.read_bytes(), key.read_bytes())


def test_unreadable_and_empty_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    assert _refusal(certificates, str(missing), "--grpc-server-cert") == (
        f"--grpc-server-cert '{missing}': cannot read it: No such file or directory"
    )
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    assert _refusal(private_key, str(empty), "--http-ssl-key") == (
        f"--http-ssl-key '{empty}': the file is empty"
    )
    assert "cannot read it: Is a directory" in _refusal(certificates, str(tmp_path), "--c")


def test_files_swapped_say_what_they_hold(pair: tuple[Path, Path]) -> None:
    cert, key = pair
    assert _refusal(certificates, str(key), "--grpc-server-cert") == (
        f"--grpc-server-cert '{key}': no certificate in it (it holds a PRIVATE KEY)"
    )
    assert _refusal(private_key, str(cert), "--grpc-server-key") == (
        f"--grpc-server-key '{cert}': no private key in it (it holds a CERTIFICATE)"
    )


def test_der_and_broken_pem(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    cert, _ = pair
    body = b"".join(cert.read_bytes().split(b"\n")[1:-2])
    der = tmp_path / "server.der"
    der.write_bytes(base64.b64decode(body))
    assert "it holds no PEM block" in _refusal(certificates, str(der), "--c")
    assert "openssl x509 -inform der" in _refusal(certificates, str(der), "--c")

    broken = tmp_path / "broken.pem"
    broken.write_bytes(cert.read_bytes().replace(b"M", b"!", 1))
    assert _refusal(certificates, str(broken), "--c") == (
        f"--c '{broken}': the certificate in it is not valid base64"
    )
    not_x509 = tmp_path / "not_x509.pem"
    not_x509.write_text(
        "-----BEGIN CERTIFICATE-----\n"
        + base64.b64encode(b"not a certificate").decode()
        + "\n-----END CERTIFICATE-----\n"
    )
    assert _refusal(certificates, str(not_x509), "--c").startswith(
        f"--c '{not_x509}': the certificate in it does not parse as X.509 ("
    )
    chain = tmp_path / "chain.pem"
    chain.write_bytes(cert.read_bytes() + not_x509.read_bytes())
    assert "certificate 2 of 2 in it does not parse" in _refusal(certificates, str(chain), "--c")


@pytest.mark.parametrize("traditional", [False, True], ids=["pkcs8", "traditional"])
def test_an_encrypted_key_is_refused_not_prompted_for(
    tmp_path: Path, pair: tuple[Path, Path], traditional: bool
) -> None:
    cert, key = pair
    locked = encrypted_copy(key, tmp_path / "locked.key", traditional)
    message = _refusal(key_pair, str(cert), "--c", str(locked), "--grpc-server-key")
    assert message.startswith(
        f"--grpc-server-key '{locked}': the private key is encrypted with a passphrase"
    )


def test_a_key_of_another_certificate(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    cert, _ = pair
    _, other_key = self_signed(tmp_path, "other")
    assert _refusal(key_pair, str(cert), "--http-ssl-cert", str(other_key), "--http-ssl-key") == (
        f"--http-ssl-key '{other_key}' is not the private key of the certificate in "
        f"--http-ssl-cert '{cert}' (the first certificate there must be the server's own)"
    )


def test_a_key_block_that_is_no_key(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    cert, _ = pair
    junk = tmp_path / "junk.key"
    junk.write_text(
        "-----BEGIN PRIVATE KEY-----\n"
        + base64.b64encode(b"\x30\x03\x02\x01\x00").decode()
        + "\n-----END PRIVATE KEY-----\n"
    )
    assert _refusal(key_pair, str(cert), "--c", str(junk), "--k").startswith(
        f"--k '{junk}': the private key does not parse ("
    )


def test_grpc_files_without_grpc_tls_are_refused() -> None:
    assert TlsSettings(grpc_cert="c.pem", grpc_key="k.pem").problem() == (
        "--grpc-server-cert and --grpc-server-key without --grpc-use-ssl (or "
        "--grpc-use-ssl-mutual) would serve plain gRPC; add --grpc-use-ssl=true, or leave "
        "them out"
    )
    assert TlsSettings(grpc_root="ca.pem").problem().startswith("--grpc-root-cert without")
    assert TlsSettings(grpc=True, grpc_cert="c.pem", grpc_key="k.pem").problem() == ""
    assert TlsSettings(http_cert="c.pem", http_key="k.pem").problem() == ""
