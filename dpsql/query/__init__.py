"""Analyst SQL -> differentially private answers.

``dpsql.query.answer.run_statement`` is the one entry point (``Session.sql``
calls it); the stages are separate modules: :mod:`statement` (what kind of
statement), :mod:`parse` (SELECT -> QueryPlan over an allowlist, with
:mod:`predicates`, :mod:`keys` and :mod:`aggregates`),
:mod:`plan` (QueryPlan -> bounded SQL and noise), :mod:`engine` (runs SQL),
:mod:`post` (noisy measures -> answer table), :mod:`cache` (repeats are free),
:mod:`released` (free queries over released tables). See docs/sql.md.
"""
