"""``dpsql init``: create a store from sensitive tables and a policy (the CLI's own command).

It makes a new file on this machine, so it runs in the terminal only: neither
through ``dpsql serve`` nor over ``CALL dpsql``.
"""

from __future__ import annotations

import click

from dpsql.commands.admin import outside_option, outside_report
from dpsql.commands.common import LocalPath, cli, json_option
from dpsql.commands.render import json_text
from dpsql.errors import ConfigurationError
from dpsql.outside import DomainError, Handling


def _imports(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ConfigurationError(f"--import takes TABLE=FILE, got {value!r}")
        out[name] = path
    return out


@cli.command("init")
@click.argument("db", type=LocalPath(dir_okay=False))
@click.option("--policy", "policy_path", required=True, type=LocalPath(exists=True,
              dir_okay=False), help="The policy YAML to apply first.")
@click.option("--import", "imports", multiple=True, metavar="TABLE=FILE",
              help="Import a CSV or Parquet file as a sensitive table (repeatable).")
@click.option("--na", default=None, metavar="STR", help="Read this string as NULL (e.g. N).")
@click.option("--keep-names", is_flag=True,
              help="Keep column names as in the file (default: lower-case identifiers).")
@click.option("--enforce-bounds", is_flag=True,
              help="Make the policy's numeric bounds CHECK constraints of the imported "
                   "tables: every value must fit, and DP queries skip clamping (faster).")
@outside_option
@json_option
def init_cmd(db: str, policy_path: str, imports: tuple[str, ...], na: str | None,
             keep_names: bool, enforce_bounds: bool, outside: Handling, as_json: bool) -> None:
    """Create the store DB, import sensitive tables and apply the first policy.

    Imported rows are checked against the policy's domains (see --outside); when
    refused, no store is created.

    Example: dpsql init adult.duckdb --policy policies/adult.yaml --import adult=adult.csv
    """
    from dpsql.policy import Policy
    from dpsql.session import init

    policy = Policy.load(policy_path)
    try:
        store, notes = init(db, policy, _imports(imports), na=na, normalize=not keep_names,
                            enforce_bounds=enforce_bounds, outside=outside)
    except DomainError as err:
        for line in outside_report(err.found, "refuse").err:
            click.echo(line, err=True)
        raise
    from dpsql.imports import tables as store_tables

    tables = store_tables(store)
    store.close()
    if as_json:
        click.echo(json_text({"store": db, "policy": policy.fingerprint, "tables": tables,
                              "notes": notes}))
        return
    click.echo(f"created {db} with tables {', '.join(tables) or '(none)'}; "
               f"policy {policy.fingerprint} applied")
    for note in notes:
        click.echo(f"  note: {note}")
