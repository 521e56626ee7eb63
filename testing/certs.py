"""Test certificate authorities and server certificates, made with ``cryptography``.

For TLS tests against servers on this host: a CA, and a server certificate it signs for
127.0.0.1 and localhost (an IP SAN, which clients that check host names need). Needs the
``cryptography`` package (in the ``outboxkit[testing]`` extra).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOOPBACK_NAMES = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA: its certificate file (what clients trust) and the key and name it signs with."""

    cert_file: Path
    key: Any
    name: Any


def make_ca(directory: Path, common_name: str = "outboxkit test CA") -> CertificateAuthority:
    """Create a self-signed CA in ``directory`` (``<common_name>.crt``); return it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file = directory / f"{common_name.replace(' ', '-')}.crt"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return CertificateAuthority(cert_file, key, name)


def issue_server_cert(
    ca: CertificateAuthority, directory: Path, stem: str = "server"
) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, ::1 and localhost signed by ``ca``: ``(cert, key)`` files.

    The key is unencrypted PEM (mode 0600); the certificate allows server and client auth.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in LOOPBACK_NAMES]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in LOOPBACK_IPS]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca.name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    cert_file, key_file = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return cert_file, key_file
