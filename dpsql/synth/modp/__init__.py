"""MODP: minus-one data prediction (Press 2024) in PyTorch, empirical or DP (``mode=dp``).

The ``modp`` synthesizer (declared in :mod:`dpsql.synth.catalog`); it needs the
``modp`` extra (torch, dp-accounting).
"""

from dpsql.synth.modp.synthesizer import Modp

__all__ = ["Modp"]
