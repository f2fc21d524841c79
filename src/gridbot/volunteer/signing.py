"""The project's code-signing key (BOINC's own format) and the HMAC tokens of downloads and uploads.

The stock client runs an application file only with a `<file_signature>` made by the project's key, which it
trusts on first use (the first scheduler reply that carries `<code_sign_key>`). The key is RSA-1024 (BOINC's
limit), made on the server's first start and kept in its state folder with mode 0600; the private half never
leaves the server. A signature is the PKCS#1 v1.5 type-1 padding of the 32 ASCII hex digits of the file's MD5,
raised to the private exponent (shared/reference/boinc-client-protocol.md, section 2.3, checked live).

Tokens: download URLs and upload descriptors carry an HMAC-SHA-256 under a secret of the same folder, so a
URL cannot be made up for a file the server never offered, and an upload names exactly one file of one result
with its largest size (the client echoes `<xml_signature>` verbatim; section 4 of the reference).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gridbot.errors import GridbotError
from gridbot.security.keys import write_private

KEY_NAME = "code-sign-key.pem"
SECRET_NAME = "token-secret"
KEY_BITS = 1024
"""BOINC's MAX_RSA_MODULUS_BITS: the client cannot read a longer key."""


class SigningError(GridbotError):
    """The code-signing key or the token secret cannot be read or made."""


def _hex_lines(data: bytes) -> str:
    """BOINC's `sprint_hex_data`: lowercase hex, 32 bytes a line, then a line with '.'."""
    lines = [data[i:i + 32].hex() for i in range(0, len(data), 32)]
    return "\n".join(lines) + "\n.\n"


@dataclass(frozen=True)
class CodeSigner:
    """The project's RSA key: its public text for `<code_sign_key>`, and signatures of application files."""

    n: int
    e: int
    d: int

    @property
    def public_text(self) -> str:
        """The key as the client parses it: bits, then modulus and exponent (128 bytes each) in hex lines."""
        size = KEY_BITS // 8
        return f"{KEY_BITS}\n" + _hex_lines(self.n.to_bytes(size, "big") + self.e.to_bytes(size, "big"))

    def sign(self, data: bytes) -> str:
        """The `<file_signature>` text of a file whose content is `data`."""
        digest = hashlib.md5(data).hexdigest().encode()  # what the client checks: md5 as 32 hex characters
        size = KEY_BITS // 8
        block = b"\x00\x01" + b"\xff" * (size - 3 - len(digest)) + b"\x00" + digest
        return _hex_lines(pow(int.from_bytes(block, "big"), self.d, self.n).to_bytes(size, "big"))

    def verify(self, data: bytes, signature: str) -> bool:
        """Whether `signature` is this key's for `data` (the client's check, for tests)."""
        hexdigits = "".join(signature.split(".")[0].split())
        try:
            value = int(hexdigits, 16)
        except ValueError:
            return False
        block = pow(value, self.e, self.n).to_bytes(KEY_BITS // 8, "big")
        return block.endswith(b"\x00" + hashlib.md5(data).hexdigest().encode())


def load_or_make_signer(folder: Path) -> CodeSigner:
    """The code-signing key kept in `folder`, made there (mode 0600) if it has none yet.

    Never made anew over a lost one silently: a new key is refused by every client that trusted the old one
    (they must reset the project), so a missing key next to existing state is the operator's to restore."""
    path = folder / KEY_NAME
    if path.exists():
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError) as e:
            raise SigningError(f"cannot read the volunteers' code-signing key {path}: {e}; restore it from a "
                               "backup (clients trust only the key they first got)") from e
        if not isinstance(key, rsa.RSAPrivateKey) or key.key_size != KEY_BITS:
            raise SigningError(f"{path} is not a {KEY_BITS}-bit RSA key")
    else:
        key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
        write_private(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
    numbers = key.private_numbers()
    return CodeSigner(numbers.public_numbers.n, numbers.public_numbers.e, numbers.d)


class Tokens:
    """HMAC tokens over the names the server hands out (download URLs, upload descriptors, result names)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._keyed = hmac.new(secret, digestmod=hashlib.sha256)  # copied for each token: the key is set up once

    @staticmethod
    def load_or_make(folder: Path) -> Tokens:
        """The token secret kept in `folder` (mode 0600), made on first use."""
        path = folder / SECRET_NAME
        if not path.exists():
            write_private(path, secrets.token_hex(32).encode())
        try:
            return Tokens(bytes.fromhex(path.read_text().strip()))
        except (OSError, ValueError) as e:
            raise SigningError(f"cannot read the volunteers' token secret {path}: {e}") from e

    def make(self, purpose: str, *parts: object, length: int = 32) -> str:
        """A token binding `parts` for `purpose` (hex, `length` characters)."""
        mac = self._keyed.copy()
        mac.update("\x1f".join([purpose, *(str(p) for p in parts)]).encode())
        return mac.hexdigest()[:length]

    def check(self, token: str, purpose: str, *parts: object, length: int = 32) -> bool:
        """Whether `token` is the one `make` gives for the same purpose and parts (constant time)."""
        return hmac.compare_digest(token.encode(errors="replace"), self.make(purpose, *parts, length=length).encode())
