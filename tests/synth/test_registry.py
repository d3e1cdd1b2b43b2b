"""Synthesizers are declared without importing them, and loaded on use, checked."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import ClassVar

import pytest

from dpsql.errors import ConfigurationError
from dpsql.synth import base, catalog
from dpsql.synth.catalog import Declaration
from dpsql.synth.histogram import Independent

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "jax", "numpyro", "mbi")
SYNTH_MODULES = ("dpsql.synth.histogram", "dpsql.synth.range_tree", "dpsql.synth.sds",
                 "dpsql.synth.napsu_mq", "dpsql.synth.modp", "dpsql.synth.aim")


@dataclass
class Honest(Independent):
    """Independent marginals that a declaration below describes right, or wrong."""

    name: ClassVar[str] = "honest"
    is_dp: ClassVar[bool] = True


#: A declaration a plugin's entry point may name (its class is imported on use).
LAZY = Declaration("lazy_plugin", "tests.synth.lazy_plugin:Lazy", True, "Lazy marginals.",
                   options={"count_share": "float", "postprocess": "str"})


@pytest.fixture(autouse=True)
def clean_registry():
    yield
    for name in ("honest", "lazy_plugin", "misnamed"):
        base.unregister(name)


def fresh(code: str) -> dict:
    """What ``code`` prints (JSON) in a fresh interpreter of this checkout."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# -- declarations without imports -------------------------------------------------------------


def test_listing_and_finding_independent_import_no_heavy_module_in_a_fresh_process() -> None:
    seen = fresh(f"""
import json, sys
from dpsql.synth import base
listed = [d.name for d in base.declarations()]
available, known = base.available(), sorted(base.known_names())
after_listing = sorted(m for m in sys.modules if m in {HEAVY + SYNTH_MODULES!r})
base.get("independent")
print(json.dumps({{"listed": listed, "available": available, "known": known,
                   "after_listing": after_listing,
                   "after_get": sorted(m for m in sys.modules if m in {HEAVY!r})}}))
""")
    assert seen["after_listing"] == []  # listing read declarations, loaded no synthesizer
    assert seen["after_get"] == []  # get('independent') loaded histogram, not torch or JAX
    assert set(base.BUILTIN_NAMES) <= set(seen["listed"]) <= set(seen["known"])
    assert "independent" in seen["available"]


def test_known_names_are_the_builtins_and_plugins() -> None:
    plugins = {e.name for e in metadata.entry_points(group=base.ENTRY_POINTS)}
    assert base.known_names() >= set(base.BUILTIN_NAMES) | plugins
    assert "indepndent" not in base.known_names()


@pytest.mark.parametrize("declaration", catalog.BUILTIN, ids=lambda d: d.name)
def test_each_builtin_loads_and_agrees_with_its_declaration(declaration: Declaration) -> None:
    if declaration.unavailable():
        pytest.skip(declaration.unavailable())
    cls = base.load(declaration.name)  # checks is_dp, output and options against the class
    assert f"{cls.__module__}:{cls.__qualname__}" == declaration.target
    assert cls.name == declaration.name
    assert declaration.summary == cls.__doc__.strip().splitlines()[0]


def test_extras_are_the_packages_pyproject_lists() -> None:
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra, packages in catalog.EXTRAS.items():
        listed = {r.split(";")[0].split(">")[0].split("[")[0].strip().replace("-", "_")
                  for r in extras[extra]}
        assert listed == set(packages), extra


# -- a missing extra is named exactly ---------------------------------------------------------


def test_a_missing_extra_is_named_and_the_synthesizer_is_not_available(monkeypatch) -> None:
    monkeypatch.setattr(catalog, "_installed", lambda package: package != "torch")
    monkeypatch.delitem(base._registry, "modp", raising=False)
    message = "synthesizer 'modp' needs the modp extra (torch not installed): " \
              "pip install 'dpsql[modp]'"
    with pytest.raises(ConfigurationError) as refused:
        base.get("modp", mode="dp")
    assert str(refused.value) == message
    assert "modp" not in base.available()
    assert "modp" in base.known_names()  # a policy may still list it
    assert {d.name: d.install() for d in base.declarations()
            if d.unavailable()} == {"modp": "pip install 'dpsql[modp]'"}


def test_the_listing_names_the_extra_to_install(monkeypatch) -> None:
    from click.testing import CliRunner

    from dpsql.cli import _load_commands
    from dpsql.commands.release import releases_synthesizers

    _load_commands()  # the terminal's door runs the command
    monkeypatch.setattr(catalog, "_installed", lambda package: package not in ("jax", "mbi"))
    listed = json.loads(CliRunner().invoke(releases_synthesizers, ["--json"]).stdout)
    install = {r["name"]: r["install"] for r in listed}
    assert install["napsu_mq"] == "pip install 'dpsql[napsu]'"
    assert install["aim"] == install["mst"] == "pip install 'dpsql[synth]'"
    assert install["independent"] is None
    assert install["modp"] is None
    modp = next(r for r in listed if r["name"] == "modp")
    assert (modp["dp"], modp["dp_when"]) == (False, "mode=dp")


def test_the_consoles_release_form_offers_what_can_run(monkeypatch, store_path) -> None:
    import dpsql
    from dpsql.console import views

    monkeypatch.setattr(catalog, "_installed", lambda package: package != "torch")
    monkeypatch.delitem(base._registry, "modp", raising=False)
    with dpsql.connect(store_path, "admin") as admin:
        page = views.releases(admin, "token")
    assert '<option value="independent">' in page
    assert '<option value="modp">' not in page  # the policy allows it; torch is missing
    assert "modp cannot run here: synthesizer &#x27;modp&#x27; needs the modp extra" in page


# -- the contract, at declaration and at load ---------------------------------------------------


@pytest.mark.parametrize(("change", "message"), [
    pytest.param({"is_dp": "yes"}, "does not declare is_dp as a bool", id="is_dp-not-a-bool"),
    pytest.param({"options": {"seed": "int"}}, "options named seed", id="release-parameter"),
    pytest.param({"options": {"is_dp": "bool"}}, "options named is_dp", id="is_dp-option"),
    pytest.param({"output": "table"}, "output must be one of rows, representation",
                 id="output"),
    pytest.param({"extra": "everything"}, "no dpsql extra 'everything'", id="extra"),
    pytest.param({"target": "tests.synth.test_registry"}, "must be 'module:Class'",
                 id="target"),
])
def test_a_declaration_that_breaks_the_contract_is_refused_when_declared(change, message):
    fields = {"name": "honest", "target": f"{__name__}:Honest", "is_dp": True,
              "summary": "s", **change}
    with pytest.raises(ConfigurationError, match=message):
        Declaration(**fields)


@pytest.mark.parametrize(("change", "message"), [
    pytest.param({"is_dp": False}, "declared with is_dp False, but its class "
                                   f"{__name__}.Honest has True", id="is_dp"),
    pytest.param({"output": "representation"}, "output 'representation', but its class",
                 id="output"),
    pytest.param({"options": {"count_share": "float"}},
                 r"options \(count_share: float\), but its class .* has \(count_share: float, "
                 r"postprocess: str\)", id="missing-option"),
    pytest.param({"options": {"count_share": "int", "postprocess": "str"}},
                 "options .count_share: int", id="option-type"),
])
def test_a_declaration_that_disagrees_with_its_class_is_refused_when_loaded(change, message):
    fields = {"name": "honest", "target": f"{__name__}:Honest", "is_dp": True, "summary": "s",
              "options": {"count_share": "float", "postprocess": "str"}}
    base.declare(Declaration(**fields))
    assert base.get("honest").is_dp  # the declaration that agrees loads
    base.declare(Declaration(**{**fields, **change}))
    with pytest.raises(ConfigurationError, match=message):
        base.get("honest")
    with pytest.raises(ConfigurationError, match="must agree"):
        base.register("honest")(Honest)  # the class itself, against its declaration


def test_a_declared_class_that_does_not_exist_is_refused() -> None:
    base.declare(Declaration("honest", f"{__name__}:Missing", True, "s"))
    with pytest.raises(ConfigurationError, match=r"declared as .*:Missing, which does not exist"):
        base.get("honest")


def test_modp_decides_is_dp_per_configured_instance() -> None:
    declared = base.declaration("modp")
    assert (declared.is_dp, declared.dp_when) == (False, "mode=dp")
    if declared.unavailable():
        pytest.skip(declared.unavailable())
    assert base.get("modp").is_dp is False
    assert base.get("modp", mode="dp").is_dp is True


# -- plugins ------------------------------------------------------------------------------------


def test_a_plugin_declaration_is_read_without_importing_its_class(monkeypatch) -> None:
    entry = metadata.EntryPoint(name="lazy_plugin", value=f"{__name__}:LAZY",
                                group=base.ENTRY_POINTS)
    monkeypatch.setattr(base, "_plugins", lambda: {"lazy_plugin": entry})
    monkeypatch.delitem(sys.modules, "tests.synth.lazy_plugin", raising=False)
    assert "lazy_plugin" in base.known_names()
    assert base.declaration("lazy_plugin") is LAZY
    assert "lazy_plugin" in base.available()
    assert "tests.synth.lazy_plugin" not in sys.modules
    synthesizer = base.get("lazy_plugin", postprocess="project")
    assert type(synthesizer).__module__ == "tests.synth.lazy_plugin"
    assert synthesizer.postprocess == "project"


def test_a_plugin_declaring_another_name_is_refused(monkeypatch) -> None:
    entry = metadata.EntryPoint(name="misnamed", value=f"{__name__}:LAZY",
                                group=base.ENTRY_POINTS)
    monkeypatch.setattr(base, "_plugins", lambda: {"misnamed": entry})
    with pytest.raises(ConfigurationError, match="declares a synthesizer named 'lazy_plugin'"):
        base.get("misnamed")
    assert "misnamed" in base.refused()


def test_an_unknown_name_suggests_a_known_one() -> None:
    with pytest.raises(ConfigurationError, match="unknown synthesizer 'indepndent'; did you "
                                                 "mean 'independent'"):
        base.get("indepndent")
