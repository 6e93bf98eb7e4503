"""Small real images (base64) for provider tests: a 1x1 PNG and the start of a JPEG file."""

from __future__ import annotations

import base64

PNG_B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6"
    "kgAAAABJRU5ErkJggg=="
)
"""A 1x1 PNG."""

JPEG_B64 = base64.b64encode(
    b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
).decode()
"""The first bytes of a JFIF JPEG (what format sniffing reads)."""
