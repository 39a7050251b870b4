"""TLS listeners: gRPC (tritonserver's --grpc-use-ssl[-mutual]) and HTTP, with certificates
made in the test."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

cryptography = pytest.importorskip("cryptography")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def _cert(name: str, issuer: tuple | None, ca: bool, san: bool) -> tuple:  # type: ignore[type-arg]
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    return cert, key


def _write(folder: Path, name: str, cert, key) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca = _cert("edge test CA", None, ca=True, san=False)
    server = _cert("localhost", ca, ca=False, san=True)
    client = _cert("client", ca, ca=False, san=False)
    ca_pem, _ = _write(folder, "ca", *ca)
    server_pem, server_key = _write(folder, "server", *server)
    client_pem, client_key = _write(folder, "client", *client)
    return {
        "ca": ca_pem,
        "server": server_pem,
        "server_key": server_key,
        "client": client_pem,
        "client_key": client_key,
    }


def _inputs() -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for inp in inputs:
        inp.set_data_from_numpy(np.ones((1, 16), np.int32))
    return inputs


def test_mutual_tls_grpc_and_tls_http(start_server, model_repository: Path, pki) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(
        model_repository,
        "--grpc-use-ssl-mutual=true",
        f"--grpc-server-cert={pki['server']}",
        f"--grpc-server-key={pki['server_key']}",
        f"--grpc-root-cert={pki['ca']}",
        f"--http-ssl-cert={pki['server']}",
        f"--http-ssl-key={pki['server_key']}",
        wait=False,
    )
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    url = f"https://localhost:{proc.http_port}/v2/health/ready"
    deadline = time.monotonic() + 60
    while True:
        assert proc.proc.poll() is None, proc.log()
        try:
            with urllib.request.urlopen(url, context=context, timeout=1) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, proc.log()
        time.sleep(0.1)
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [2] * 16},
            ]
        }
    ).encode()
    request = urllib.request.Request(
        f"https://localhost:{proc.http_port}/v2/models/simple/infer", data=body, method="POST"
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as resp:
        assert json.load(resp)["outputs"][0]["data"] == [3] * 16
    # Plain HTTP is not served on the TLS port.
    with pytest.raises((ConnectionError, http.client.HTTPException, urllib.error.URLError)):
        urllib.request.urlopen(f"http://localhost:{proc.http_port}/v2/health/ready", timeout=2)

    client = grpcclient.InferenceServerClient(
        f"localhost:{proc.grpc_port}",
        ssl=True,
        root_certificates=str(pki["ca"]),
        private_key=str(pki["client_key"]),
        certificate_chain=str(pki["client"]),
    )
    out = client.infer("simple", _inputs()).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, np.full((1, 16), 2))
    anonymous = grpcclient.InferenceServerClient(
        f"localhost:{proc.grpc_port}", ssl=True, root_certificates=str(pki["ca"])
    )
    with pytest.raises(InferenceServerException):  # no client certificate: refused
        anonymous.infer("simple", _inputs(), client_timeout=10)


def test_incomplete_tls_flags_are_refused(start_server, model_repository: Path, pki) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(model_repository, "--grpc-use-ssl=true", wait=False)
    assert proc.proc.wait(60) != 0
    assert "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key" in proc.log()
