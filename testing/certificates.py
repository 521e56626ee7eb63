"""A throwaway certificate authority for a local TLS broker: a CA, a server certificate for
127.0.0.1 and a client certificate, written as PEM files (and a PKCS#12 keystore for Java).

Made with the ``cryptography`` package (the ``testing`` extra). The server certificate has an
IP SAN for 127.0.0.1 (aiokafka always checks the hostname) and both serverAuth and clientAuth
usages. The broker's keystore is PKCS#12 encrypted with PBE-SHA1-3DES, which Java 17 reads
(it cannot read OpenSSL 3's default PBES2 PEM keys).
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Certificates:
    """Paths of the files :func:`make_certificates` wrote, and the keystore password."""

    ca_file: Path
    server_cert: Path
    server_key: Path
    server_keystore: Path
    keystore_password: str
    client_cert: Path
    client_key: Path
    client_key_password: str


def _crypto() -> Any:
    try:
        from cryptography import x509
    except ImportError:  # pragma: no cover - the extra is missing
        raise RuntimeError(
            "a TLS broker needs the cryptography package: pip install 'outboxkit[testing]'"
        ) from None
    return x509


def make_certificates(folder: Path, days: int = 30) -> Certificates:
    """Write a CA, a server certificate (127.0.0.1, localhost) and a client certificate
    (``CN=outboxkit-client``, its key encrypted) into ``folder``."""
    x509 = _crypto()
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> Any:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def issue(
        subject: Any,
        key: Any,
        issuer: Any,
        issuer_key: Any,
        ca: bool,
        usages: list[Any],
        alt: list[Any],
    ) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
            ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        else:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
            )
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("outboxkit dev CA")
    ca_cert = issue(ca_name, ca_key, ca_name, ca_key, True, [], [])
    server_key = ec.generate_private_key(ec.SECP256R1())
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    hosts = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server_cert = issue(name("127.0.0.1"), server_key, ca_name, ca_key, False, both, hosts)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
    client_cert = issue(
        name("outboxkit-client"), client_key, ca_name, ca_key, False, client_usage, []
    )

    pem = serialization.Encoding.PEM
    keystore_password = secrets.token_urlsafe(12)
    client_key_password = secrets.token_urlsafe(12)
    files = Certificates(
        ca_file=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        server_keystore=folder / "server.p12",
        keystore_password=keystore_password,
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        client_key_password=client_key_password,
    )
    files.ca_file.write_bytes(ca_cert.public_bytes(pem))
    files.server_cert.write_bytes(server_cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    files.server_key.write_bytes(
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    files.server_key.chmod(0o600)
    java_encryption = (
        serialization.PrivateFormat.PKCS12.encryption_builder()
        .kdf_rounds(50000)
        .key_cert_algorithm(pkcs12.PBES.PBESv1SHA1And3KeyTripleDESCBC)
        .hmac_hash(hashes.SHA1())
        .build(keystore_password.encode())
    )
    files.server_keystore.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"broker", server_key, server_cert, [ca_cert], java_encryption
        )
    )
    files.client_cert.write_bytes(client_cert.public_bytes(pem))
    files.client_key.write_bytes(
        client_key.private_bytes(
            pem,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(client_key_password.encode()),
        )
    )
    files.client_key.chmod(0o600)
    return files
