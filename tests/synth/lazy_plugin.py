"""A third-party synthesizer as a plugin ships it: tests/synth/test_registry.py imports this
module only through the registry, to see that a declared plugin loads on use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dpsql.synth.histogram import Independent


@dataclass
class Lazy(Independent):
    """Independent marginals, under another name."""

    name: ClassVar[str] = "lazy_plugin"
    is_dp: ClassVar[bool] = True
