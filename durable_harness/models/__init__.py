"""The data vocabulary, each shape declared once: entries, messages, records, the session
header and the command runtime type."""

import re


def snake_case(name: str) -> str:
    """``"ModelChange"`` as ``"model_change"``: a declaration's class name as its ``type``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
