"""Synthesizers: ``dpsql.synth.get(name, **options)`` finds one by name."""

from dpsql.synth.base import (
    FittedSynthesizer,
    Resumable,
    Synthesizer,
    available,
    get,
    register,
)

__all__ = ["FittedSynthesizer", "Resumable", "Synthesizer", "available", "get", "register"]
