"""Unit key <-> lock file name: ``0000:29:00.0/tile1`` <-> ``unit-0000%3A29%3A00.0%2Ftile1.lock``.

Safe (no ``/``, no leading dot), one-to-one and reversible, for any filesystem: keys are
percent-encoded like ``urllib.parse.quote(key, safe="")``, and hashed when too long for a file
name. urllib.parse is not imported for it: with the ipaddress module it pulls in, that cost
~2.5 ms of every launch (issue 4); tests/leases/test_lease_names.py checks the two functions
below against urllib.parse.
"""

from __future__ import annotations

UNIT_PREFIX = "unit-"
LOCK_SUFFIX, HOLDER_SUFFIX = ".lock", ".holder"
# NAME_MAX is 255 bytes; a longer escaped key is hashed. quote() only writes '%' + two hex
# digits, so '%s...' can never be an escaped key: no collision.
_MAX_ESCAPED_KEY = 200
_HASHED = "%sha256-"


def lock_file_name(key: str) -> str:
    """``0000:29:00.0/tile1`` -> ``unit-0000%3A29%3A00.0%2Ftile1.lock``: no ``/``, no dot."""
    return _escape(key) + LOCK_SUFFIX


def holder_file_name(key: str) -> str:
    return _escape(key) + HOLDER_SUFFIX


def key_of_lock_file(name: str) -> str | None:
    """The unit key of a lock file name; None for a hashed (very long) key."""
    stem = name[len(UNIT_PREFIX) : -len(LOCK_SUFFIX)]
    return None if stem.startswith(_HASHED) else _unquote(stem)


def _escape(key: str) -> str:
    # Percent-encode all but [A-Za-z0-9_.~-]: one-to-one, and portable to any filesystem.
    escaped = _quote(key)
    if not escaped or len(escaped) > _MAX_ESCAPED_KEY:
        import hashlib  # ~15 ms to import (OpenSSL): only for keys too long to escape

        escaped = _HASHED + hashlib.sha256(key.encode()).hexdigest()
    return UNIT_PREFIX + escaped


_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _quote(key: str) -> str:
    """UTF-8 bytes, each one outside ``[A-Za-z0-9_.~-]`` as ``%XX`` (upper-case hex)."""
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in key.encode())


def _unquote(text: str) -> str:
    """Undo :func:`_quote` as ``urllib.parse.unquote`` does: each run of ASCII is decoded as
    UTF-8 (with replacement) after turning valid ``%XX`` into bytes; a ``%`` without two hex
    digits stays as it is; non-ASCII characters are kept and split the runs."""
    if "%" not in text:
        return text
    parts: list[str] = []
    pending = bytearray()
    i = 0
    while i < len(text):
        char = text[i]
        if char == "%" and len(text) >= i + 3 and set(text[i + 1 : i + 3]) <= _HEX_DIGITS:
            pending.append(int(text[i + 1 : i + 3], 16))
            i += 3
            continue
        if char.isascii():
            pending.append(ord(char))
        else:
            parts += [pending.decode("utf-8", "replace"), char]
            pending.clear()
        i += 1
    parts.append(pending.decode("utf-8", "replace"))
    return "".join(parts)
