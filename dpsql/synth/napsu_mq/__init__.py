"""NAPSU-MQ: noise-aware synthetic data with calibrated uncertainty (the ``napsu_mq`` synthesizer).

See docs/napsu_mq.md. Needs the ``napsu`` extra (jax, numpyro, threadpoolctl).
"""

from dpsql.synth.napsu_mq.synthesizer import DiagnosticsWarning, FittedNapsuMQ, NapsuMQ

__all__ = ["DiagnosticsWarning", "FittedNapsuMQ", "NapsuMQ"]
