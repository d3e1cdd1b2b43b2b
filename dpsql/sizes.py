"""Memory sizes: this machine's memory (its control group's limit when lower), and sizes as text.

``--free-query-memory 2GiB`` and DuckDB's ``memory_limit`` read and write sizes
the same way (:func:`parse_size`, :func:`mib`).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from dpsql.errors import ConfigurationError


def machine_memory() -> int:
    """This host's memory in bytes, or its control group's limit when that is lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf on this platform
        total = 16 * 2**30
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(Path(limit).read_text().strip()))
    return total


_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes from a size as DuckDB writes one: ``512MiB``, ``2GB``, ``1.5G`` (binary), ``1024``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigurationError(f"{text!r} is not a size: write a number and a unit, as in "
                                 "512MiB, 2GiB or 4GB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def mib(size: int) -> str:
    """``size`` as DuckDB reads a memory setting."""
    return f"{max(size // 2**20, 1)}MiB"
