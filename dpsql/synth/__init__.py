"""Synthesizers: ``dpsql.synth.get(name, **options)`` finds one by name.

Declared in :mod:`dpsql.synth.catalog` and imported on use: importing this package
loads no synthesizer (nor torch, JAX or NumPyro).
"""

from dpsql.synth.base import (
    FittedSynthesizer,
    Resumable,
    Synthesizer,
    available,
    declarations,
    get,
    load,
    register,
)
from dpsql.synth.catalog import Declaration

__all__ = ["Declaration", "FittedSynthesizer", "Resumable", "Synthesizer", "available",
           "declarations", "get", "load", "register"]
