"""The environment a tool process inherits: credentials removed, an allow list lets some back.

``design/providers-and-tools.md`` ("Credentials") explains the rule.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping

SECRET_NAME_PATTERNS: tuple[str, ...] = ("*_KEY", "*_TOKEN", "*_SECRET", "*PASSWORD*")
"""Environment variable names (shell-style, matched upper-cased) that look like credentials.
Provider keys (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``) match ``*_KEY``."""


def is_secret_name(name: str) -> bool:
    """True when the environment variable ``name`` looks like a credential
    (:data:`SECRET_NAME_PATTERNS`, case-insensitive)."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_NAME_PATTERNS)


def tool_environment(base: Mapping[str, str], allow: Iterable[str] = ()) -> dict[str, str]:
    """The environment a tool process inherits from ``base`` (normally ``os.environ``): every
    variable except those that look like credentials (:func:`is_secret_name`), unless a name
    or shell-style pattern in ``allow`` (matched exactly, case-sensitive) lets it through.
    """
    allowed = tuple(allow)
    return {
        name: value
        for name, value in base.items()
        if not is_secret_name(name) or any(fnmatch.fnmatchcase(name, a) for a in allowed)
    }
