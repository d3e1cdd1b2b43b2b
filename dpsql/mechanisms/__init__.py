"""Mechanisms: calibration, cost and privacy map, each beside its proof.

One protocol (:class:`dpsql.mechanisms.base.Mechanism`): ``calibrate`` from a
share and a sensitivity under the privacy unit, ``cost(kind)`` exact and
rounded up, ``check(d_in, d_out)`` the privacy map. The mechanisms:

- :mod:`~dpsql.mechanisms.laplace`: discrete Laplace (pure DP) on integer vectors;
- :mod:`~dpsql.mechanisms.gaussian`: discrete Gaussian (zCDP) on integer vectors;
- :mod:`~dpsql.mechanisms.additive`: the policy's choice of the two for counts and
  fixed-point sums (SQL measures, synthesizers' marginals);
- :mod:`~dpsql.mechanisms.exponential`: the exponential mechanism (SQL quantiles,
  AIM, MST and NAPSU-MQ's selections);
- :mod:`~dpsql.mechanisms.noisy_max`: report noisy max with discrete Laplace (SDS);
- :mod:`~dpsql.mechanisms.threshold`: key selection's threshold (SQL ``GROUP BY``
  over keys nobody declared).

Submodules are imported by name; this package imports none of them.
"""
