"""Throwaway certificate authorities for TLS tests against servers on this host.

One module for every TLS test: :func:`make_ca` makes a CA, :func:`issue_certificate` signs a
server or client certificate with it, and :func:`make_certificates` writes the whole set a TLS
Kafka broker needs. Made with the ``cryptography`` package (the ``testing`` extra).

Server certificates carry SANs for 127.0.0.1, ::1 and localhost (aiokafka and ``verify-full``
check the host name) and both serverAuth and clientAuth usages (Kafka's inter-broker listener
is a client too). A broker's keystore is PKCS#12 encrypted with PBE-SHA1-3DES, which Java 17
reads (it cannot read OpenSSL 3's default PBES2 keys).
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOOPBACK_NAMES = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA: its certificate file (what clients trust), and the key and name it signs with."""

    cert_file: Path
    key: Any
    name: Any
    certificate: Any


@dataclass(frozen=True)
class Certificates:
    """Paths of the files :func:`make_certificates` wrote, and the passwords they need."""

    ca_file: Path
    server_cert: Path
    server_key: Path
    server_keystore: Path
    keystore_password: str
    client_cert: Path
    client_key: Path
    client_key_password: str


def _x509() -> Any:
    try:
        from cryptography import x509
    except ImportError:  # pragma: no cover - the extra is missing
        raise RuntimeError(
            "TLS test certificates need the cryptography package: pip install 'outboxkit[testing]'"
        ) from None
    return x509


def _name(common_name: str) -> Any:
    from cryptography.x509.oid import NameOID

    return _x509().Name([_x509().NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(
    directory: Path, common_name: str = "outboxkit test CA", days: int = 30
) -> CertificateAuthority:
    """A self-signed CA, its certificate written to ``directory`` as ``<common_name>.crt``."""
    x509 = _x509()
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file = directory / f"{common_name.replace(' ', '-')}.crt"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return CertificateAuthority(cert_file, key, name, certificate)


def issue_certificate(
    ca: CertificateAuthority,
    directory: Path,
    stem: str = "server",
    *,
    common_name: str = "localhost",
    server: bool = True,
    key_password: str | None = None,
    days: int = 30,
) -> tuple[Path, Path]:
    """A certificate signed by ``ca`` and its key, as ``(cert, key)`` PEM files (key mode 0600).

    A server certificate names this host (127.0.0.1, ::1, localhost) and allows server and
    client auth; a client certificate (``server=False``) allows client auth only. The key is
    encrypted with ``key_password`` when one is given.
    """
    x509 = _x509()
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if server:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        names = [x509.DNSName(name) for name in LOOPBACK_NAMES]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in LOOPBACK_IPS]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    certificate = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False).sign(
        ca.key, hashes.SHA256()
    )
    encryption: Any = serialization.NoEncryption()
    if key_password is not None:
        encryption = serialization.BestAvailableEncryption(key_password.encode())
    cert_file, key_file = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    key_file.chmod(0o600)
    return cert_file, key_file


def make_certificates(folder: Path, days: int = 30) -> Certificates:
    """Write what a TLS Kafka broker and its clients need into ``folder``: a CA, a server
    certificate with its key and a PKCS#12 keystore for Java, and a client certificate
    (``CN=outboxkit-client``) whose key is encrypted."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.serialization import load_pem_private_key, pkcs12

    ca = make_ca(folder, "outboxkit dev CA", days)
    server_cert, server_key = issue_certificate(ca, folder, "server", days=days)
    client_key_password = secrets.token_urlsafe(12)
    client_cert, client_key = issue_certificate(
        ca,
        folder,
        "client",
        common_name="outboxkit-client",
        server=False,
        key_password=client_key_password,
        days=days,
    )
    keystore_password = secrets.token_urlsafe(12)
    java_encryption = (
        serialization.PrivateFormat.PKCS12.encryption_builder()
        .kdf_rounds(50000)
        .key_cert_algorithm(pkcs12.PBES.PBESv1SHA1And3KeyTripleDESCBC)
        .hmac_hash(hashes.SHA1())
        .build(keystore_password.encode())
    )
    keystore = folder / "server.p12"
    keystore.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"broker",
            load_pem_private_key(server_key.read_bytes(), None),  # type: ignore[arg-type]
            x509.load_pem_x509_certificate(server_cert.read_bytes()),
            [ca.certificate],
            java_encryption,
        )
    )
    return Certificates(
        ca_file=ca.cert_file,
        server_cert=server_cert,
        server_key=server_key,
        server_keystore=keystore,
        keystore_password=keystore_password,
        client_cert=client_cert,
        client_key=client_key,
        client_key_password=client_key_password,
    )
