r"""Encryption at rest (opt-in): message content sealed with AES-GCM, per tenant.

With a :class:`Keyring`, everything that holds message content is sealed on
the client before it reaches Redis: each stream entry's message and preview,
the copies of system and pinned messages, and the cached summary. Tool call
ids, token counts and the session's counters stay clear (planning needs
them; they hold no content). Tokens are counted before sealing.

Keys: a keyring holds master keys by id and names the active one. Each
tenant's key is derived from a master key with HKDF-SHA256 (``info`` is the
tenant id), so tenants never share a key and no per-tenant key has to be
stored. Each sealed value names the master key id it was sealed with, so
rotation is: add a key, make it active; new writes use it, old entries
still open. The session is bound in as associated data: a sealed value
copied into another tenant's (or session's) keys does not open.

A sealed value is ``b"\xffctx1" + len(key id) + key id + 12-byte nonce +
ciphertext-and-tag``. Values that start with ``{`` are plain JSON (written
before encryption was turned on) and read as they are.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ctxstore.errors import ConfigurationError, DecryptionError

if TYPE_CHECKING:
    from ctxstore.settings import Settings

__all__ = ["MAGIC", "Keyring"]

MAGIC = b"\xffctx1"
_NONCE = 12


class Keyring:
    """Master keys by id, one of them active; seals and opens values per tenant.

    Args:
        keys: Master key id -> 32-byte key (or its base64 form).
        active: The id of the key new values are sealed with.

    Raises:
        ConfigurationError: A key is not 32 bytes, an id is empty or too
            long, or ``active`` is not one of the ids.
    """

    def __init__(self, keys: Mapping[str, bytes | str], active: str) -> None:
        self._keys: dict[str, bytes] = {}
        for key_id, key in keys.items():
            try:
                raw = base64.b64decode(key, validate=True) if isinstance(key, str) else key
            except (binascii.Error, ValueError) as exc:
                raise ConfigurationError(f"encryption key {key_id!r} is not base64") from exc
            if len(raw) != 32:
                raise ConfigurationError(f"encryption key {key_id!r} must be 32 bytes")
            if not key_id or len(key_id.encode()) > 64:
                raise ConfigurationError("an encryption key id must be 1 to 64 bytes")
            self._keys[key_id] = raw
        if active not in self._keys:
            raise ConfigurationError(f"the active encryption key {active!r} is not in the keyring")
        self.active = active

    @classmethod
    def from_settings(cls, settings: Settings) -> Keyring | None:
        """The keyring the settings describe; ``None`` when encryption is off."""
        if settings.encryption_active_key is None:
            return None
        return cls(
            {k: v.get_secret_value() for k, v in settings.encryption_keys.items()},
            settings.encryption_active_key,
        )

    @staticmethod
    def generate_key() -> str:
        """A new random 32-byte key, base64 (for settings)."""
        return base64.b64encode(os.urandom(32)).decode()

    def index_key(self, tenant: str) -> tuple[str, bytes]:
        """The active key's id, and the key a tenant's search terms are hashed with.

        Derived from the active master key (HKDF, ``info`` names the tenant
        and the use), so the search index holds no term in clear and no two
        tenants' hashes agree.
        """
        return self.active, _derived(self._keys[self.active], b"index:" + tenant.encode())

    def seal(self, tenant: str, session: str, plaintext: bytes) -> bytes:
        """Encrypt ``plaintext`` for one session of one tenant, with the active key."""
        key_id = self.active.encode()
        nonce = os.urandom(_NONCE)
        sealed = self._cipher(tenant, self.active).encrypt(nonce, plaintext, _aad(tenant, session))
        return MAGIC + bytes([len(key_id)]) + key_id + nonce + sealed

    def open(self, tenant: str, session: str, value: bytes) -> bytes:
        """Decrypt a value :meth:`seal` made; plain JSON passes through.

        Raises:
            DecryptionError: The key id is unknown, or the value does not
                authenticate (a wrong key, another session's value, tampering).
        """
        if not value.startswith(MAGIC):
            return value
        try:
            size = value[len(MAGIC)]
            start = len(MAGIC) + 1
            key_id = value[start : start + size].decode()
            nonce = value[start + size : start + size + _NONCE]
            body = value[start + size + _NONCE :]
        except (IndexError, UnicodeDecodeError) as exc:
            raise DecryptionError(
                "a sealed value is truncated", tenant=tenant, session=session
            ) from exc
        if key_id not in self._keys:
            raise DecryptionError(
                f"no encryption key {key_id!r} in the keyring", tenant=tenant, session=session
            )
        try:
            return self._cipher(tenant, key_id).decrypt(nonce, body, _aad(tenant, session))
        except (InvalidTag, ValueError) as exc:  # ValueError: a nonce cut short
            raise DecryptionError(
                f"a value sealed with key {key_id!r} does not open: wrong key or altered",
                tenant=tenant,
                session=session,
            ) from exc

    def _cipher(self, tenant: str, key_id: str) -> AESGCM:
        return _tenant_cipher(self._keys[key_id], tenant)


@lru_cache(maxsize=4096)
def _tenant_cipher(master: bytes, tenant: str) -> AESGCM:
    # HKDF costs ~10 us: once per (master key, tenant) and process.
    return AESGCM(_derived(master, b"tenant:" + tenant.encode()))


@lru_cache(maxsize=4096)
def _derived(master: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"ctxstore", info=info).derive(master)


def _aad(tenant: str, session: str) -> bytes:
    return f"ctxstore\x00{tenant}\x00{session}".encode()
