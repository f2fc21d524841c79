"""TLS for the server and pinning for its clients, with the `cryptography` package and the ssl module.

`gridbot server --tls self-signed` makes a key and a certificate once and keeps them beside the access
file; the access file carries the certificate's SHA-256 fingerprint, and clients that have it accept that
certificate and no other, with no certificate authority involved (as SSH pins host keys). A server with
a certificate from a CA (`--tls-cert/--tls-key`) is pinned the same way by the access file the server
writes; a client given no fingerprint checks it the ordinary way (system authorities, host name).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import ipaddress
import socket
import ssl
from pathlib import Path

from gridbot.security.keys import AccessError, write_private

FINGERPRINT_PREFIX = "sha256:"


def fingerprint_of_der(der: bytes) -> str:
    """`sha256:<hex>` of a certificate in DER form."""
    return FINGERPRINT_PREFIX + hashlib.sha256(der).hexdigest()


def fingerprint_of_file(cert: Path) -> str:
    """The fingerprint of the first certificate of a PEM file."""
    try:
        pem = cert.read_text()
    except OSError as e:
        raise AccessError(f"cannot read the TLS certificate {cert}: {e.strerror}") from e
    try:
        der = ssl.PEM_cert_to_DER_cert(pem)
    except ValueError as e:
        raise AccessError(f"{cert} is not a PEM certificate: {e}") from e
    return fingerprint_of_der(der)


def digest(fingerprint: str) -> bytes:
    """The raw SHA-256 of a `sha256:<hex>` fingerprint (colons allowed, as OpenSSL prints them)."""
    text = fingerprint.removeprefix(FINGERPRINT_PREFIX).replace(":", "").strip().lower()
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise AccessError(f"TLS fingerprint {fingerprint!r} is not sha256:<64 hex digits>; copy it from the access "
                          "file the server wrote")
    return raw


def self_signed(cert: Path, key: Path, names: list[str]) -> str:
    """Create an ECDSA P-256 key and a ten-year self-signed certificate for `names` (host names or
    addresses) unless both files exist; return the certificate's fingerprint."""
    if cert.exists() and key.exists():
        return fingerprint_of_file(cert)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0] if names else "gridbot")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(private.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=3650))
                   .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                   .sign(private, hashes.SHA256()))
    write_private(key, private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
    write_private(cert, certificate.public_bytes(serialization.Encoding.PEM))
    return fingerprint_of_der(certificate.public_bytes(serialization.Encoding.DER))


def default_names(host: str) -> list[str]:
    """The names a self-signed certificate is made for: the bind address, this host's name, loopback."""
    names = [socket.getfqdn(), socket.gethostname(), "localhost", "127.0.0.1"]
    if host not in ("0.0.0.0", "::", ""):
        names.insert(0, host)
    return [n for n in names if n]


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise AccessError(f"cannot load the TLS certificate {cert} and key {key}: {e}") from e
    return ctx


def client_context(fingerprint: str | None) -> ssl.SSLContext:
    """A client context: with a fingerprint, the chain is not checked here (the pin is, after the
    handshake); without one, the system's certificate authorities and the host name are."""
    ctx = ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if fingerprint:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def check_pin(sock: ssl.SSLSocket, fingerprint: str, where: str) -> None:
    """Refuse a connection whose certificate is not the pinned one."""
    der = sock.getpeercert(binary_form=True) or b""
    if not hmac.compare_digest(hashlib.sha256(der).digest(), digest(fingerprint)):
        raise AccessError(f"the server at {where} presented a certificate with fingerprint {fingerprint_of_der(der)}, "
                          f"not the pinned {fingerprint}: refusing to talk to it (a wrong server, or the server's "
                          "certificate changed: take the fingerprint from its new access file)")


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection that accepts only the certificate with the given fingerprint."""

    def __init__(self, host: str, port: int | None, fingerprint: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=client_context(fingerprint))
        self.fingerprint = fingerprint

    def connect(self) -> None:
        super().connect()
        assert isinstance(self.sock, ssl.SSLSocket)
        try:
            check_pin(self.sock, self.fingerprint, f"{self.host}:{self.port}")
        except AccessError:
            self.close()
            raise
