"""The emulated ``pg_catalog`` and ``information_schema``: tables, rows and functions.

SQL clients learn what exists by querying PostgreSQL's system catalogs. dpsql
answers those queries from a small DuckDB database built here (once per change
of the store, shared by connections, each adding its own client rows; the
queries run in a sandbox process, :mod:`dpsql.sandbox`) from a sanitized
description of the store (see :mod:`dpsql.server.catalog`): schemas, table
names, column names and types, and comments. It never holds a row, a row
count, a size or a statistic of a private table: ``reltuples`` is -1 (unknown)
and size functions return NULL.

Tables live in schema ``pgc`` (pg_catalog) and views in ``pgis``
(information_schema); :mod:`dpsql.server.rewrite` points client queries there.
Functions clients call (``format_type``, ``pg_table_is_visible``, ...) are
macros in ``main``, where unqualified calls find them first.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from dpsql.server.pgschema import (
    CLIENT_TABLES,
    DATABASE_OID,
    INFORMATION_SCHEMA,
    NAMESPACES,
    OWNER,
    OWNER_OID,
    TABLES,
    VIEWS,
)
from dpsql.server.pgtypes import TYPES, from_duckdb

_O, _B, _S, _I2, _I4 = "UINTEGER", "BOOLEAN", "VARCHAR", "SMALLINT", "INTEGER"

# How format_type() names each type (PostgreSQL's SQL-standard spellings).
_FORMAT_NAMES = {
    "bool": "boolean", "int2": "smallint", "int4": "integer", "int8": "bigint",
    "float4": "real", "float8": "double precision", "varchar": "character varying",
    "bpchar": "character", "char": '"char"', "timestamp": "timestamp without time zone",
    "timestamptz": "timestamp with time zone", "time": "time without time zone",
    "timetz": "time with time zone", "varbit": "bit varying",
}

# Functions clients call while browsing. Nothing here reads a private value.
# Lookups the macros below read: their column names start with dpsql_ so that a macro
# argument (an arbitrary client column such as ``oid``) can never bind to them.
LOOKUPS: dict[str, str] = {
    "dpsql_class": """SELECT c.oid AS dpsql_k, c.relname AS dpsql_v,
        c.relnamespace AS dpsql_ns, n.nspname AS dpsql_nsname
        FROM pgc.pg_class c JOIN pgc.pg_namespace n ON n.oid = c.relnamespace""",
    "dpsql_types": """SELECT f.oid AS dpsql_k, f.formatted AS dpsql_v, t.typname AS dpsql_name
        FROM pgc.type_format f JOIN pgc.pg_type t ON t.oid = f.oid""",
    "dpsql_descr": """SELECT objoid AS dpsql_k, objsubid AS dpsql_sub, description AS dpsql_v
        FROM pgc.pg_description""",
    "dpsql_ns": "SELECT oid AS dpsql_k, nspname AS dpsql_v FROM pgc.pg_namespace",
    "dpsql_roles": "SELECT oid AS dpsql_k, rolname AS dpsql_v FROM temp.pg_roles",
    "dpsql_settings": "SELECT lower(name) AS dpsql_k, setting AS dpsql_v FROM temp.pg_settings",
}

# Functions clients call while browsing. Nothing here reads a private value.
MACROS = f"""
CREATE MACRO pg_get_userbyid(o) AS CASE WHEN o IS NULL THEN NULL ELSE coalesce(
    (SELECT dpsql_v FROM pgc.dpsql_roles WHERE dpsql_k = o LIMIT 1), '{OWNER}') END;
CREATE MACRO format_type(t, m) AS CASE
    WHEN t IS NULL THEN NULL
    WHEN t = 1700 AND m >= 4 THEN 'numeric(' || CAST((m - 4) >> 16 AS VARCHAR) || ','
        || CAST((m - 4) & 65535 AS VARCHAR) || ')'
    ELSE coalesce((SELECT dpsql_v FROM pgc.dpsql_types WHERE dpsql_k = t LIMIT 1), '???') END;
CREATE MACRO pg_table_is_visible(o) AS EXISTS (SELECT 1 FROM pgc.dpsql_class
    WHERE dpsql_k = o AND dpsql_ns IN ({NAMESPACES['pg_catalog']},
    {NAMESPACES['public']}, {NAMESPACES['released']}));
CREATE MACRO pg_type_is_visible(o) AS true;
CREATE MACRO pg_function_is_visible(o) AS true;
CREATE MACRO pg_collation_is_visible(o) AS true;
CREATE MACRO pg_opclass_is_visible(o) AS true;
CREATE MACRO pg_conversion_is_visible(o) AS true;
CREATE MACRO pg_operator_is_visible(o) AS true;
CREATE MACRO pg_statistics_obj_is_visible(o) AS true;
CREATE MACRO pg_ts_config_is_visible(o) AS true;
CREATE MACRO pg_ts_dict_is_visible(o) AS true;
CREATE MACRO pg_ts_parser_is_visible(o) AS true;
CREATE MACRO pg_ts_template_is_visible(o) AS true;
CREATE MACRO getdatabaseencoding() AS 'UTF8';
CREATE MACRO current_setting(n) AS (SELECT dpsql_v FROM pgc.dpsql_settings
    WHERE dpsql_k = lower(n) LIMIT 1),
    (n, missing_ok) AS (SELECT dpsql_v FROM pgc.dpsql_settings WHERE dpsql_k = lower(n)
    LIMIT 1);
CREATE MACRO pg_get_expr(e, r) AS NULL::VARCHAR, (e, r, p) AS NULL::VARCHAR;
CREATE MACRO pg_get_indexdef(o) AS NULL::VARCHAR, (o, c, p) AS NULL::VARCHAR;
CREATE MACRO pg_get_constraintdef(o) AS NULL::VARCHAR, (o, p) AS NULL::VARCHAR;
CREATE MACRO pg_get_viewdef(o) AS NULL::VARCHAR, (o, p) AS NULL::VARCHAR;
CREATE MACRO pg_get_triggerdef(o) AS NULL::VARCHAR, (o, p) AS NULL::VARCHAR;
CREATE MACRO pg_get_ruledef(o) AS NULL::VARCHAR, (o, p) AS NULL::VARCHAR;
CREATE MACRO pg_get_partkeydef(o) AS NULL::VARCHAR;
CREATE MACRO pg_get_function_result(o) AS NULL::VARCHAR;
CREATE MACRO pg_get_function_arguments(o) AS NULL::VARCHAR;
CREATE MACRO pg_get_function_identity_arguments(o) AS NULL::VARCHAR;
CREATE MACRO pg_get_statisticsobjdef_columns(o) AS NULL::VARCHAR;
CREATE MACRO pg_get_serial_sequence(t, c) AS NULL::VARCHAR;
CREATE MACRO pg_relation_is_publishable(o) AS false;
CREATE MACRO pg_tablespace_location(o) AS '';
CREATE MACRO pg_encoding_to_char(e) AS 'UTF8';
CREATE MACRO pg_char_to_encoding(e) AS 6;
CREATE MACRO pg_is_in_recovery() AS false;
CREATE MACRO pg_table_size(o) AS NULL::BIGINT;
CREATE MACRO pg_relation_size(o) AS NULL::BIGINT, (o, f) AS NULL::BIGINT;
CREATE MACRO pg_total_relation_size(o) AS NULL::BIGINT;
CREATE MACRO pg_indexes_size(o) AS NULL::BIGINT;
CREATE MACRO pg_database_size(o) AS NULL::BIGINT;
CREATE MACRO pg_size_pretty(s) AS NULL::VARCHAR;
CREATE MACRO obj_description(o) AS (SELECT dpsql_v FROM pgc.dpsql_descr
    WHERE dpsql_k = o AND dpsql_sub = 0 LIMIT 1),
    (o, c) AS (SELECT dpsql_v FROM pgc.dpsql_descr WHERE dpsql_k = o AND dpsql_sub = 0
    LIMIT 1);
CREATE MACRO col_description(o, n) AS (SELECT dpsql_v FROM pgc.dpsql_descr
    WHERE dpsql_k = o AND dpsql_sub = n LIMIT 1);
CREATE MACRO shobj_description(o, c) AS NULL::VARCHAR;
CREATE MACRO has_table_privilege(t, p) AS upper(p) LIKE '%SELECT%',
    (u, t, p) AS upper(p) LIKE '%SELECT%';
CREATE MACRO has_column_privilege(t, c, p) AS upper(p) LIKE '%SELECT%',
    (u, t, c, p) AS upper(p) LIKE '%SELECT%';
CREATE MACRO has_any_column_privilege(t, p) AS upper(p) LIKE '%SELECT%',
    (u, t, p) AS upper(p) LIKE '%SELECT%';
CREATE MACRO has_schema_privilege(s, p) AS upper(p) LIKE '%USAGE%',
    (u, s, p) AS upper(p) LIKE '%USAGE%';
CREATE MACRO has_database_privilege(d, p) AS upper(p) LIKE '%CONNECT%',
    (u, d, p) AS upper(p) LIKE '%CONNECT%';
CREATE MACRO has_function_privilege(f, p) AS false, (u, f, p) AS false;
CREATE MACRO has_sequence_privilege(s, p) AS false, (u, s, p) AS false;
CREATE MACRO pg_has_role(r, p) AS true, (u, r, p) AS true;
CREATE MACRO array_upper(a, d) AS CASE WHEN len(a) > 0 THEN len(a) END;
CREATE MACRO array_lower(a, d) AS CASE WHEN len(a) > 0 THEN 1 END;
CREATE MACRO array_length(a, d) AS CASE WHEN len(a) > 0 THEN len(a) END;
CREATE MACRO quote_ident(s) AS CASE WHEN regexp_full_match(s, '[a-z_][a-z0-9_$]*') THEN s
    ELSE '"' || replace(s, '"', '""') || '"' END;
CREATE MACRO _pg_expandarray(a) AS
    unnest(list_transform(range(len(a)), lambda i: {{'x': a[i + 1], 'n': i + 1}}));
CREATE MACRO pg_get_keywords() AS TABLE SELECT keyword_name AS word,
    CASE keyword_category WHEN 'reserved' THEN 'R' WHEN 'type_function' THEN 'T'
    WHEN 'column_name' THEN 'C' ELSE 'U' END AS catcode,
    keyword_category AS catdesc, keyword_category AS barelabel FROM duckdb_keywords();
CREATE MACRO dpsql_regclass_name(o) AS CASE WHEN o IS NULL THEN NULL ELSE coalesce(
    (SELECT dpsql_v FROM pgc.dpsql_class WHERE dpsql_k = o LIMIT 1), o::VARCHAR) END;
CREATE MACRO dpsql_regclass_oid(n) AS CASE
    WHEN regexp_full_match(n, '[0-9]+') THEN TRY_CAST(n AS UINTEGER)
    ELSE (SELECT dpsql_k FROM pgc.dpsql_class
        WHERE dpsql_v = lower(split_part(n, '.', -1))
        AND (NOT contains(n, '.') OR dpsql_nsname = lower(split_part(n, '.', 1)))
        ORDER BY dpsql_ns LIMIT 1) END;
CREATE MACRO dpsql_regtype_name(o) AS format_type(o, NULL);
CREATE MACRO dpsql_regtype_oid(n) AS CASE
    WHEN regexp_full_match(n, '[0-9]+') THEN TRY_CAST(n AS UINTEGER)
    ELSE (SELECT dpsql_k FROM pgc.dpsql_types
        WHERE lower(split_part(n, '.', -1)) IN (dpsql_name, dpsql_v) LIMIT 1) END;
CREATE MACRO dpsql_regnamespace_name(o) AS (SELECT dpsql_v FROM pgc.dpsql_ns
    WHERE dpsql_k = o LIMIT 1);
CREATE MACRO dpsql_regnamespace_oid(n) AS (SELECT dpsql_k FROM pgc.dpsql_ns
    WHERE dpsql_v = lower(n) LIMIT 1);
CREATE MACRO dpsql_regrole_name(o) AS pg_get_userbyid(o);
CREATE MACRO dpsql_regrole_oid(n) AS (SELECT dpsql_k FROM pgc.dpsql_roles WHERE dpsql_v = n
    LIMIT 1);
CREATE MACRO to_regclass(n) AS dpsql_regclass_oid(n);
CREATE MACRO to_regtype(n) AS dpsql_regtype_oid(n);
CREATE MACRO to_regnamespace(n) AS dpsql_regnamespace_oid(n);
CREATE MACRO to_regrole(n) AS dpsql_regrole_oid(n);
"""

# OIDs PostgreSQL gives its own catalog relations (clients sometimes hard-code them).
_KNOWN_RELATION_OIDS = {
    "pg_type": 1247, "pg_attribute": 1249, "pg_proc": 1255, "pg_class": 1259,
    "pg_authid": 1260, "pg_database": 1262, "pg_am": 2601, "pg_attrdef": 2604,
    "pg_constraint": 2606, "pg_inherits": 2611, "pg_index": 2610, "pg_operator": 2617,
    "pg_rewrite": 2618, "pg_trigger": 2620, "pg_description": 2609, "pg_namespace": 2615,
    "pg_depend": 2608, "pg_language": 2612, "pg_collation": 3456, "pg_tablespace": 1213,
    "pg_extension": 3079, "pg_policy": 3256, "pg_statistic_ext": 3381, "pg_enum": 3501,
    "pg_shdescription": 2396, "pg_publication": 6104, "pg_publication_rel": 6106,
    "pg_auth_members": 1261, "pg_cast": 2605, "pg_opclass": 2616, "pg_aggregate": 2600,
    "pg_sequence": 2224, "pg_foreign_table": 3118, "pg_foreign_server": 1417,
    "pg_foreign_data_wrapper": 2328, "pg_event_trigger": 3466, "pg_conversion": 2607,
    "pg_default_acl": 826, "pg_init_privs": 3394, "pg_partitioned_table": 3350,
    "pg_publication_namespace": 6237,
}


def relation_oid(schema: str, name: str, taken: set[int]) -> int:
    """A stable OID for a relation (the same across rebuilds and restarts)."""
    if schema == "pg_catalog" and name in _KNOWN_RELATION_OIDS:
        return _KNOWN_RELATION_OIDS[name]
    oid = 20000 + zlib.crc32(f"{schema}.{name}".encode()) % 2_000_000_000
    while oid in taken:
        oid += 1
    return oid


@dataclass(frozen=True)
class Relation:
    """One relation the catalog shows: schema, name, columns (name, DuckDB type), comment."""

    schema: str
    name: str
    columns: tuple[tuple[str, str], ...]
    description: str | None = None
    column_descriptions: tuple[str | None, ...] = ()  # by column position; may be shorter
    kind: str = "r"


@dataclass(frozen=True)
class Client:
    """What the catalog shows about the connected client itself."""

    user: str
    database: str
    max_connections: int
    settings: Mapping[str, str]


_ARROW = {"UINTEGER": pa.uint32(), "BOOLEAN": pa.bool_(), "VARCHAR": pa.string(),
          "SMALLINT": pa.int16(), "INTEGER": pa.int32(), "REAL": pa.float32(),
          "BIGINT": pa.int64(), "TIMESTAMPTZ": pa.timestamp("us", tz="UTC")}


def _arrow_type(duck_type: str) -> pa.DataType:
    if duck_type.endswith("[]"):
        return pa.list_(_ARROW[duck_type[:-2]])
    return _ARROW[duck_type]


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[Sequence[object]],
            columns: Sequence[tuple[str, str]] | None = None) -> None:
    """Bulk-insert rows (through Arrow: row-by-row inserts are far too slow)."""
    if not rows:
        return
    columns = columns if columns is not None else TABLES[table]
    schema = pa.schema([(name, _arrow_type(kind)) for name, kind in columns])
    data = pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows],
                                schema=schema)
    con.register("_dpsql_rows", data)
    try:
        home = "temp" if table in CLIENT_TABLES else "pgc"
        con.execute(f"INSERT INTO {home}.{table} SELECT * FROM _dpsql_rows")
    finally:
        con.unregister("_dpsql_rows")


def _full(table: str, values: Mapping[str, object]) -> list[object]:
    """A row of ``table`` with the given columns set and the rest NULL/false/0 defaults."""
    row = []
    for name, kind in TABLES[table]:
        if name in values:
            row.append(values[name])
        elif kind == _B:
            row.append(False)
        elif kind in (_O, _I2, _I4, "BIGINT"):
            row.append(0)
        else:
            row.append(None)
    return row


def _create(con: duckdb.DuckDBPyConnection, table: str, *, temp: bool) -> None:
    cols = ", ".join(f'"{c}" {t}' for c, t in TABLES[table])
    con.execute(f"CREATE TEMP TABLE {table} ({cols})" if temp else
                f"CREATE TABLE pgc.{table} ({cols})")


def build_shared(con: duckdb.DuckDBPyConnection, relations: Sequence[Relation]) -> None:
    """Create the catalogs every connection shares in ``con`` (an empty in-memory DuckDB).

    The per-client tables are created here as temporary tables too, so that the
    macros and views that read them bind; each connection then adds its own
    (:func:`attach_client`).
    """
    con.execute("CREATE SCHEMA pgc")
    con.execute("CREATE SCHEMA pgis")
    for table in TABLES:
        _create(con, table, temp=table in CLIENT_TABLES)
    con.execute("CREATE TABLE pgc.type_format (oid UINTEGER, formatted VARCHAR)")
    for name, body in LOOKUPS.items():
        con.execute(f"CREATE VIEW pgc.{name} AS {body}")
    for statement in MACROS.split(";\n"):
        if statement.strip():
            con.execute(statement)
    for name, body in VIEWS.items():
        con.execute(f"CREATE VIEW pgc.{name} AS {body}")
    for name, body in INFORMATION_SCHEMA.items():
        con.execute(f"CREATE VIEW pgis.{name} AS {body}")
    _fill_static(con)
    _fill_relations(con, relations)


def prepare_client(cur: duckdb.DuckDBPyConnection, state: dict[str, object], client: Client,
                   settings: Mapping[str, str], cursors: tuple[tuple[str, bool], ...]) -> None:
    """(In a sandbox.) Make a connection's kept cursor show its client, settings and cursors.

    ``state`` is what was set on ``cur`` before (empty for a new cursor): only
    what changed is written again.
    """
    if not state:
        attach_client(cur, client)
        state.update(settings=dict(client.settings), cursors=())
    if state["settings"] != dict(settings):
        set_settings(cur, settings)
        state["settings"] = dict(settings)
    if state["cursors"] != cursors:
        set_cursors(cur, cursors)
        state["cursors"] = cursors


def attach_client(cur: duckdb.DuckDBPyConnection, client: Client) -> None:
    """Give one cursor on the shared catalog its client's own rows (temporary tables)."""
    for table in CLIENT_TABLES:
        _create(cur, table, temp=True)
    _fill_client(cur, client)


def _fill_static(con: duckdb.DuckDBPyConnection) -> None:
    _insert(con, "pg_namespace", [(oid, name, OWNER_OID, None)
                                  for name, oid in NAMESPACES.items()])
    types, formats = [], []
    for t in TYPES.values():
        types.append(_full("pg_type", {
            "oid": t.oid, "typname": t.name, "typnamespace": NAMESPACES["pg_catalog"],
            "typowner": OWNER_OID, "typlen": t.size, "typbyval": 0 < t.size <= 8,
            "typtype": "p" if t.category == "P" else "b", "typcategory": t.category,
            "typisdefined": True, "typdelim": ",", "typelem": t.elem_oid,
            "typarray": t.array_oid, "typinput": t.input,
            "typoutput": "array_out" if t.is_array else f"{t.name}out",
            "typreceive": "array_recv" if t.is_array else f"{t.name}recv",
            "typsend": "array_send" if t.is_array else f"{t.name}send",
            "typalign": "i", "typstorage": "p" if t.size > 0 else "x", "typtypmod": -1,
            "typcollation": 100 if t.category == "S" else 0}))
        if t.is_array:
            elem = TYPES[t.elem_oid].name
            formats.append((t.oid, _FORMAT_NAMES.get(elem, elem) + "[]"))
        else:
            formats.append((t.oid, _FORMAT_NAMES.get(t.name, t.name)))
    _insert(con, "pg_type", types)
    _insert(con, "type_format", formats, [("oid", _O), ("formatted", _S)])
    _insert(con, "pg_am", [(2, "heap", "heap_tableam_handler", "t"),
                           (403, "btree", "bthandler", "i")])
    _insert(con, "pg_tablespace", [(1663, "pg_default", OWNER_OID, None, None),
                                   (1664, "pg_global", OWNER_OID, None, None)])
    _insert(con, "pg_collation", [(100, "default", NAMESPACES["pg_catalog"], OWNER_OID, "d",
                                   True, -1, None, None, None, None)])
    _insert(con, "pg_language", [(14, "sql", OWNER_OID, False, True, 0, 0, 0, None)])
    con.execute("INSERT INTO pgc.pg_timezone_names VALUES ('UTC', 'UTC', INTERVAL 0 SECOND, "
                "false)")
    con.execute("INSERT INTO pgc.pg_timezone_abbrevs VALUES ('UTC', INTERVAL 0 SECOND, false)")


def _fill_relations(con: duckdb.DuckDBPyConnection, relations: Sequence[Relation]) -> None:
    shown = [Relation("pg_catalog", name, tuple(cols)) for name, cols in TABLES.items()]
    shown += [Relation("pg_catalog", name, (), kind="v") for name in VIEWS]
    shown += list(relations)
    taken: set[int] = set()
    classes, attributes, descriptions = [], [], []
    for rel in shown:
        oid = relation_oid(rel.schema, rel.name, taken)
        taken.add(oid)
        classes.append(_full("pg_class", {
            "oid": oid, "relname": rel.name, "relnamespace": NAMESPACES[rel.schema],
            "relowner": OWNER_OID, "relam": 2 if rel.kind == "r" else 0, "relfilenode": oid,
            "relpages": 0, "reltuples": -1.0, "relpersistence": "p", "relkind": rel.kind,
            "relnatts": len(rel.columns), "relispopulated": True,
            "relreplident": "n" if rel.schema == "pg_catalog" else "d"}))
        for number, (column, duck_type) in enumerate(rel.columns, start=1):
            pg, typmod = from_duckdb(duck_type)
            if rel.schema == "pg_catalog" and duck_type == _O:
                pg = TYPES[26]  # the catalog's own object ids are oid
            attributes.append(_full("pg_attribute", {
                "attrelid": oid, "attname": column, "atttypid": pg.oid, "attstattarget": -1,
                "attlen": pg.size, "attnum": number, "attcacheoff": -1, "atttypmod": typmod,
                "attbyval": 0 < pg.size <= 8, "attalign": "i",
                "attstorage": "p" if pg.size > 0 else "x", "attcompression": "",
                "attidentity": "", "attgenerated": "", "attislocal": True,
                "attcollation": 100 if pg.category == "S" else 0}))
            about = rel.column_descriptions[number - 1:number]
            if about and about[0]:
                descriptions.append((oid, _KNOWN_RELATION_OIDS["pg_class"], number, about[0]))
        if rel.description:
            descriptions.append((oid, _KNOWN_RELATION_OIDS["pg_class"], 0, rel.description))
    for name, oid in NAMESPACES.items():
        if name == "released":
            descriptions.append((oid, _KNOWN_RELATION_OIDS["pg_namespace"], 0,
                                 "synthetic tables released by an administrator; free to read"))
        elif name == "public":
            descriptions.append((oid, _KNOWN_RELATION_OIDS["pg_namespace"], 0,
                                 "private datasets: aggregate queries answered with "
                                 "differential privacy"))
    _insert(con, "pg_class", classes)
    _insert(con, "pg_attribute", attributes)
    _insert(con, "pg_description", descriptions)


def _fill_client(con: duckdb.DuckDBPyConnection, client: Client) -> None:
    user_oid = 16386
    _insert(con, "pg_roles", [_full("pg_roles", {
        "rolname": client.user, "rolinherit": True, "rolcanlogin": True,
        "rolconnlimit": client.max_connections, "rolpassword": "********", "oid": user_oid})])
    _insert(con, "pg_authid", [_full("pg_authid", {
        "rolname": client.user, "rolinherit": True, "rolcanlogin": True,
        "rolconnlimit": client.max_connections, "oid": user_oid})])
    _insert(con, "pg_user", [_full("pg_user", {
        "usename": client.user, "usesysid": user_oid, "passwd": "********"})])
    _insert(con, "pg_database", [_full("pg_database", {
        "oid": DATABASE_OID, "datname": client.database, "datdba": OWNER_OID, "encoding": 6,
        "datlocprovider": "c", "datallowconn": True, "datconnlimit": -1,
        "dattablespace": 1663, "datcollate": "C", "datctype": "C"})])
    set_settings(con, client.settings)


def set_cursors(con: duckdb.DuckDBPyConnection, cursors: Sequence[tuple[str, bool]]) -> None:
    """Replace the rows of pg_cursors with the connection's open cursors (name, holdable)."""
    con.execute("DELETE FROM temp.pg_cursors")
    _insert(con, "pg_cursors", [_full("pg_cursors", {
        "name": name, "is_holdable": hold, "is_scrollable": True}) for name, hold in cursors])


def set_settings(con: duckdb.DuckDBPyConnection, settings: Mapping[str, str]) -> None:
    """Replace the rows of pg_settings with the connection's current parameters."""
    con.execute("DELETE FROM temp.pg_settings")
    _insert(con, "pg_settings", [_full("pg_settings", {
        "name": name, "setting": value, "category": "Client Connection Defaults",
        "context": "user", "vartype": "string", "source": "session", "boot_val": value,
        "reset_val": value, "pending_restart": False}) for name, value in settings.items()])
