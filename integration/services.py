"""Real servers for integration tests: ``redis-server`` and ``memcached`` as subprocesses.

The servers themselves are :mod:`quickzones.testing.provision`'s (:class:`RedisServer`,
:class:`MemcachedServer`, one :class:`Service` base with stop, kill, pause and restart on
the same port), the same ones the pytest plugin's fixtures start; this module adds the
throwaway TLS certificates the TLS election tests need.

Each server listens on 127.0.0.1 on a free port, keeps no data on disk (a restart loses
everything, which the election tests rely on) and is always cleaned up: by ``close()``/the
context manager, at interpreter exit, and on Linux by the kernel if the test process dies
first.
"""

from __future__ import annotations

from pathlib import Path

from quickzones.testing.provision import (
    HOST,
    SERVICES,
    MemcachedServer,
    RedisServer,
    Service,
    ServiceUnavailable,
    TLSFiles,
)


def make_tls_files(folder: Path) -> TLSFiles:
    """A throwaway CA and a server certificate for 127.0.0.1 (needs ``cryptography``)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "quick test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TLSFiles(folder / "server.pem", folder / "server.key", folder / "ca.pem")
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    return files


__all__ = [
    "SERVICES",
    "MemcachedServer",
    "RedisServer",
    "Service",
    "ServiceUnavailable",
    "TLSFiles",
    "make_tls_files",
]
