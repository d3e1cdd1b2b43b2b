"""``dpsql demo``: a governed store from the bundled Adult sample, end to end."""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dpsql.commands.common import cli
from dpsql.commands.render import arrow_table, heading, table
from dpsql.errors import BudgetExceeded

if TYPE_CHECKING:
    from dpsql.session import Session


def _bundled(name: str) -> Path:
    return Path(str(resources.files("dpsql").joinpath(f"data/{name}")))


@cli.command("demo")
@click.option("--db", "db", default=None, type=click.Path(dir_okay=False),
              help="Where to create the demo store (default: a temporary directory).")
def demo_cmd(db: str | None) -> None:
    """Create a store from the bundled Adult sample and walk through dpsql.

    Nothing outside the demo store is touched; without --db it lives in a
    temporary directory that is removed afterwards.
    """
    if db:
        run_demo(Path(db))
        return
    with tempfile.TemporaryDirectory(prefix="dpsql-demo-") as tmp:
        run_demo(Path(tmp) / "adult.duckdb")


def run_demo(path: Path) -> None:
    """The demo's steps, printed as they run."""
    from dpsql.session import connect, init

    click.echo(heading("1. Create a governed store"))
    store, _notes = init(path, _bundled("adult.yaml"), {"adult": _bundled("adult_sample.csv")})
    store.close()
    click.echo(f"   {path}: table adult (5,000 rows of the UCI Adult data), policy applied")
    with connect(path, "admin") as admin:
        _show_policy(admin)
        click.echo()
        click.echo(heading("2. Budgets the policy grants"))
        from dpsql.admin.budgets import show_budgets
        from dpsql.commands.admin import budgets_text

        for line in budgets_text(show_budgets(admin)).out:
            click.echo(line)
        click.echo()
        click.echo(heading("3. The ledger charges before anything private is computed"))
        _show_ledger(path)
        click.echo()
        _show_queries(path)
        click.echo()
        click.echo(heading("5. Every request is audited"))
        rows = admin.audit(last=5)
        click.echo(table([[r["id"], r["user"], r["action"], r["outcome"],
                           r["cost"].describe(admin.policy.delta) if r["cost"] else ""]
                          for r in rows],
                         ["id", "user", "action", "outcome", "cost"], right=[0]))
        click.echo()
        _show_releases(admin)


def _show_policy(session: Session) -> None:
    ds = session.policy.dataset("adult")
    rows = []
    for col in ds.columns.values():
        if col.type == "categorical":
            domain = f"{len(col.values or ())} values"
        elif col.numeric:
            domain = f"[{col.bounds[0]:g}, {col.bounds[1]:g}]" if col.bounds else ""
            if col.edges:
                domain += f", {col.bins_text}"
        else:
            domain = "never queryable"
        rows.append([col.name, col.type, domain])
    click.echo(table(rows, ["column", "type", "public domain"]))


def _show_ledger(path: Path) -> None:
    from dpsql.session import connect

    with connect(path, "bob") as bob:
        cost = bob.cost(epsilon=0.5)
        spent = 0
        while True:
            try:
                charge = bob.ledger.charge("bob", "adult", cost, "demo: a charge of epsilon 0.5")
            except BudgetExceeded as err:
                click.echo(f"   refused: {err}")
                break
            spent += 1
            click.echo(f"   charged bob {cost.describe(bob.policy.delta)}; "
                       f"left: {charge.remaining.describe(bob.policy.delta, 'down')}")


DEMO_QUERIES = (
    ("a range count", "SELECT COUNT(*) AS people FROM adult WHERE age BETWEEN 20 AND 29"),
    ("a 2-way marginal", "SELECT sex, income_50k, COUNT(*) AS n FROM adult "
                         "GROUP BY sex, income_50k"),
    ("a binned marginal", "SELECT dp_bin(age, 20) AS age_from, COUNT(*) AS n FROM adult "
                          "GROUP BY 1 ORDER BY 1"),
    ("a range average, at epsilon 0.5",
     "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5) AVG(hours_per_week) AS hours "
     "FROM adult WHERE income_50k = 1 AND age >= 30"),
    ("the range count again", "SELECT COUNT(*) AS people FROM adult WHERE age BETWEEN 20 AND 29"),
)


def _show_queries(path: Path) -> None:
    """Ask a few range and marginal queries as alice and show each answer beside its cost."""
    from dpsql.session import connect

    click.echo(heading("4. Ask DP questions in SQL (as alice; answers are noisy)"))
    with connect(path, "alice") as alice:
        alice.sql("SET dpsql.ci = 0.95")
        delta = alice.policy.delta
        for what, sql in DEMO_QUERIES:
            answer = alice.sql(sql)
            cost = "free (a repeat: the cached answer)" if answer.cached else \
                answer.cost.describe(delta)
            click.echo(f"   {what}: {sql}")
            for line in arrow_table(answer.table).splitlines():
                click.echo(f"     {line}")
            click.echo(f"     cost: {cost}")
        left = alice.budget()[0].remaining.describe(delta, "down")
        click.echo(f"   alice has {left} left; intervals hold the true value with 95% "
                   "confidence under the noise")


def _show_releases(session: Session) -> None:
    """Release independent and joint synthetic tables; show their fidelity and the ideal."""
    from dpsql.analysis.fidelity import evaluate_release

    click.echo(heading("6. DP synthetic tables, with provenance"))
    columns = ["age", "sex", "race", "income_50k"]
    rows = []
    ideal = None
    for synthesizer in ("independent", "joint"):
        result = session.release("adult", synthesizer=synthesizer, epsilon=1, columns=columns,
                                 name=f"adult_{synthesizer}", seed=7)
        record = result.record
        click.echo(f"   released {result.table} ({record['rows']:,} rows of "
                   f"{', '.join(columns)}) by {synthesizer}, charged "
                   f"{session.cost(epsilon=1).describe(session.policy.delta)}")
        evaluation = evaluate_release(session.context(), result.name, seed=7)
        summary = evaluation.synthetic.summary()
        ideal = evaluation.ideal.summary()
        rows.append([synthesizer, summary["median_d"], summary["mean_d"], summary["median_z"],
                     summary["workload_error"]])
    assert ideal is not None
    rows.append(["bootstrap ideal", ideal["median_d"], ideal["mean_d"], ideal["median_z"],
                 ideal["workload_error"]])
    click.echo("   fidelity over every 1-way and 2-way crosstab cell (computed from the real data "
               "by the admin: not DP):")
    click.echo(table([[r[0], *(f"{v:.3f}" for v in r[1:])] for r in rows],
                     ["release", "median d", "mean d", "median |z|", "workload error"],
                     right=[1, 2, 3, 4]))
    click.echo("   independent keeps each column but loses correlations; joint keeps them at "
               "the price of noise in every cell.")
    click.echo("   analysts read released.* free: dpsql releases list, dpsql releases show "
               "adult_joint")
