"""The provenance record of a release: what, how, from what, at what privacy cost.

One JSON record per release, stored in ``dpsql.releases`` (in the same
transaction as the table), in the table's COMMENT, and in the Parquet
key-value metadata of an export. It holds public facts (policy, domain,
parameters) and DP outputs (noise scales, measurement descriptors, the DP row
estimate); never a non-DP statistic of the source.

This module owns ``dpsql.releases`` (the records) and ``dpsql.release_states``
(the DP state a resumable release samples more copies from): their schema
(:data:`TABLES`) and every write, which :mod:`dpsql.release` makes in its own
transaction through :func:`insert`, :func:`update`, :func:`supersede` and
:func:`keep_state`.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np

from dpsql.domain import quote
from dpsql.errors import ConfigurationError, ReleaseError
from dpsql.files import write_private
from dpsql.policy import Policy, did_you_mean
from dpsql.store import Store, Tables, check_identifier, now

if TYPE_CHECKING:
    import pyarrow as pa

FORMAT = "dpsql.provenance/1"
#: Where a release whose fit failed its diagnostics is kept: no analyst reads this schema (the
#: free database copies only ``released``) until an administrator publishes it.
HELD = "held"
METADATA_KEY = b"dpsql.provenance"
_COLUMNS = ("release_id", "name", "dataset", "synthesizer", "privacy", "released_by",
            "released_at", "superseded_by", "record")

TABLES = Tables("provenance", {
    1: ("""CREATE TABLE dpsql.releases (
            release_id VARCHAR PRIMARY KEY, name VARCHAR NOT NULL, dataset VARCHAR NOT NULL,
            synthesizer VARCHAR NOT NULL, privacy VARCHAR NOT NULL, released_by VARCHAR NOT NULL,
            released_at TIMESTAMP NOT NULL, superseded_by VARCHAR, record VARCHAR NOT NULL)""",),
    # 2: the DP state of resumable releases (more copies later at no privacy cost).
    2: ("""CREATE TABLE dpsql.release_states (
            release_id VARCHAR PRIMARY KEY, synthesizer VARCHAR NOT NULL,
            state VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL)""",),
    # 8: releases whose fit failed its diagnostics, kept from analysts until published.
    8: (f"CREATE SCHEMA IF NOT EXISTS {HELD}",),
})


def _plain(value: Any) -> Any:
    """JSON fallback for numpy scalars and arrays, fractions and datetimes."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Fraction):
        return float(value)
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "as_dict"):
        return value.as_dict()
    return str(value)


def _finite(value: Any) -> Any:
    """Replace NaN and infinities (not valid JSON) by strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def to_json(record: dict[str, Any], *, indent: int | None = None) -> str:
    """The record as strict JSON (numpy values and fractions converted)."""
    plain = json.loads(json.dumps(record, default=_plain))
    return json.dumps(_finite(plain), indent=indent, sort_keys=indent is not None,
                      allow_nan=False)


def jsonable(value: Any) -> Any:
    """``value`` converted to plain JSON types (what the record will hold)."""
    return json.loads(to_json({"v": value}))["v"]


def dataset_fingerprint(policy: Policy, dataset: str, column_types: dict[str, str]) -> str:
    """A hash of the dataset's public description: its policy section and column types.

    Never of the data: a hash of private rows would let anyone test a guess.
    """
    section = json.loads(policy.canonical)["datasets"][dataset]
    text = json.dumps({"dataset": dataset, "policy": section, "types": column_types},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def comment(record: dict[str, Any]) -> str:
    """The table COMMENT: a one-line summary and the full record."""
    cost = record.get("cost", {}).get("charged", {})
    summary = (f"dpsql release {record['release_id']} of {record['dataset']['name']} by "
               f"{record['synthesizer']['name']} ({record['privacy']}, {cost_text(cost)})")
    return summary + "\n" + to_json(record)


def cost_text(cost: dict[str, Any]) -> str:
    """A cost as recorded (``PrivacyCost.as_dict``) in words: rho with epsilon, or epsilon."""
    if cost.get("value") == "inf":
        return "unbounded"
    if "rho" in cost:
        text = f"rho={float(cost['rho']):.6g}"
        if "epsilon" in cost:
            text += f" (epsilon={cost['epsilon']:.4g} at delta={cost['delta']:g})"
        return text
    if "epsilon" in cost:
        return f"epsilon={cost['epsilon']}"
    return "no privacy budget"


def sql_string(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def insert(cur: duckdb.DuckDBPyConnection, record: dict[str, Any]) -> None:
    """Add the provenance row of a new release (inside the release's transaction)."""
    cur.execute(
        "INSERT INTO dpsql.releases VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?)",
        [record["release_id"], record["name"], record["dataset"]["name"],
         record["synthesizer"]["name"], record["privacy"], record["released_by"],
         datetime.fromisoformat(record["released_at"]), to_json(record)],
    )


def update(cur: duckdb.DuckDBPyConnection, record: dict[str, Any]) -> None:
    """Rewrite the record of an existing release (more copies were added)."""
    cur.execute("UPDATE dpsql.releases SET record = ? WHERE release_id = ?",
                [to_json(record), record["release_id"]])


def supersede(cur: duckdb.DuckDBPyConnection, old_id: str, new_id: str) -> None:
    """Mark a replaced release's row as superseded by ``new_id`` (the row is kept).

    Its stored DP state goes: a superseded release samples no more copies.
    """
    cur.execute("UPDATE dpsql.releases SET superseded_by = ? WHERE release_id = ?",
                [new_id, old_id])
    cur.execute("DELETE FROM dpsql.release_states WHERE release_id = ?", [old_id])


def keep_state(cur: duckdb.DuckDBPyConnection, release_id: str, synthesizer: str,
               state: str) -> None:
    """Store the DP state of a resumable release (inside the release's transaction)."""
    cur.execute("INSERT INTO dpsql.release_states VALUES (?, ?, ?, ?)",
                [release_id, synthesizer, state, now()])


def stored_state(store: Store, release_id: str) -> str | None:
    """The DP state kept for ``release_id`` (JSON), or None."""
    row = store.cursor().execute("SELECT state FROM dpsql.release_states WHERE release_id = ?",
                                 [release_id]).fetchone()
    return None if row is None else str(row[0])


def live_versions(cur: duckdb.DuckDBPyConnection) -> dict[str, tuple[str, str]]:
    """Name -> (release id, md5 of its record) of each live release, in ``cur``'s snapshot."""
    rows = cur.execute("SELECT name, release_id, md5(record) FROM dpsql.releases "
                       "WHERE superseded_by IS NULL").fetchall()
    return {str(name): (str(release), str(digest)) for name, release, digest in rows}


def released_signature(store: Store) -> tuple[int, Any]:
    """How many releases were written, and when the last was: changes with every release."""
    row = store.cursor().execute(
        "SELECT count(*), max(released_at) FROM dpsql.releases").fetchone()
    assert row is not None
    return int(row[0]), row[1]


def _row(row: tuple[Any, ...]) -> dict[str, Any]:
    entry = dict(zip(_COLUMNS, row, strict=True))
    entry["record"] = json.loads(entry["record"])
    return entry


def current(store: Store, name: str,
            cur: duckdb.DuckDBPyConnection | None = None) -> dict[str, Any] | None:
    """The live (not superseded) release row named ``name``, or None."""
    cur = cur or store.cursor()
    rows = cur.execute(
        f"SELECT {', '.join(_COLUMNS)} FROM dpsql.releases "
        "WHERE name = ? AND superseded_by IS NULL", [name]).fetchall()
    return _row(rows[0]) if rows else None


def find(store: Store, name: str) -> dict[str, Any]:
    """The live release named ``name``; unknown names raise with a did-you-mean."""
    entry = current(store, name)
    if entry is None:
        names = [r["name"] for r in releases(store)]
        raise ReleaseError(f"no release named {name!r}{did_you_mean(name, names)}; list them "
                           "with: dpsql releases list")
    return entry


def releases(store: Store, *, include_superseded: bool = False) -> list[dict[str, Any]]:
    """Release rows, oldest first (live ones only unless ``include_superseded``)."""
    where = "" if include_superseded else " WHERE superseded_by IS NULL"
    rows = store.cursor().execute(
        f"SELECT {', '.join(_COLUMNS)} FROM dpsql.releases{where} "
        "ORDER BY released_at, release_id").fetchall()
    return [_row(r) for r in rows]


def export(store: Store, name: str, path: str | Path, *, mode: int = 0o600,
           admin: bool = False) -> dict[str, Any]:
    """Write release ``name``'s table to a Parquet file with its record in the key-value metadata.

    Released tables are free to read, so any user of the store may export one; a
    held one (its fit failed its diagnostics) only an ``admin``.
    Written by pyarrow (store connections have no file access) through
    :func:`dpsql.files.write_private`: a new file of ``mode`` (the owner's only
    unless the caller asks for more) renamed onto ``path``, so a failure leaves
    no partial file and nothing planted at ``path`` is followed.
    """
    import pyarrow.parquet as pq

    target = Path(path)
    if target.suffix.lower() != ".parquet":
        raise ConfigurationError(f"export writes Parquet: give a path ending in .parquet, got "
                                 f"{target.name}")
    entry, data = read_release(store, name, admin=admin)
    metadata = dict(data.schema.metadata or {})
    metadata[METADATA_KEY] = to_json(entry["record"]).encode()
    data = data.replace_schema_metadata(metadata)
    try:
        write_private(target, lambda out: pq.write_table(data, out), mode=mode)
    except OSError as err:
        raise ConfigurationError(f"cannot write {target}: {err.strerror}") from err
    return {"name": name, "path": str(target), "rows": data.num_rows,
            "release_id": entry["release_id"], "mode": f"{mode:o}"}


def read_release(store: Store, name: str, *, admin: bool) -> tuple[dict[str, Any], pa.Table]:
    """Release ``name``'s live row and its table; a held one (not published) ``admin`` only."""
    entry = find(store, name)
    schema = entry["record"]["table"].partition(".")[0]
    if schema != "released" and not admin:
        raise ReleaseError(f"release {name!r} is held from analysts until an administrator "
                           "publishes it (its fit failed its diagnostics)")
    data = store.cursor().sql(
        f"SELECT * FROM {schema}.{quote(check_identifier(name, 'release name'))}"
    ).to_arrow_table()
    return entry, data


def read_parquet_record(path: str | Path) -> dict[str, Any]:
    """The provenance record stored in an exported Parquet file."""
    import pyarrow.parquet as pq

    metadata = pq.read_schema(path).metadata or {}
    if METADATA_KEY not in metadata:
        raise ReleaseError(f"{path} carries no dpsql provenance")
    return dict(json.loads(metadata[METADATA_KEY]))
