"""Unit key <-> lock file name: ``0000:29:00.0/tile1`` <-> ``unit-0000%3A29%3A00.0%2Ftile1.lock``.

Safe (no ``/``, no leading dot), one-to-one and reversible, for any filesystem: keys are
percent-encoded with ``urllib.parse.quote(key, safe="")``, and hashed when too long for a
file name.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

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
    return None if stem.startswith(_HASHED) else unquote(stem)


def _escape(key: str) -> str:
    # Percent-encode all but [A-Za-z0-9_.~-]: one-to-one, and portable to any filesystem.
    escaped = quote(key, safe="")
    if not escaped or len(escaped) > _MAX_ESCAPED_KEY:
        import hashlib  # loads OpenSSL: imported only for the rare key too long to escape

        escaped = _HASHED + hashlib.sha256(key.encode()).hexdigest()
    return UNIT_PREFIX + escaped
