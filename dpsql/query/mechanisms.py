"""Moved: a measure's additive noise is :class:`dpsql.mechanisms.additive.Noise`.

This name stays only until ``query/cache.py``, whose owner has changes in
flight, imports it from there; nothing else uses it.
"""

from dpsql.mechanisms.additive import Noise

__all__ = ["Noise"]
