"""The synthesizer names a policy may list are the ones that really exist."""

from __future__ import annotations

from importlib import metadata

from dpsql.synth import base


def test_builtin_names_are_what_the_builtin_modules_register() -> None:
    # known_names() lists the built-ins without importing them (torch, jax): the two must
    # agree, or a policy naming a real synthesizer would be refused (or a typo accepted).
    plugins = {e.name for e in metadata.entry_points(group="dpsql.synthesizers")}
    assert set(base.available()) - plugins == set(base.BUILTIN_NAMES)
    assert "indepndent" not in base.known_names()
