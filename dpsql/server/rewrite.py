"""Catalog queries: recognise them, then point them at the emulated catalog in DuckDB SQL.

A client's query is a catalog query when every relation it reads is one of
PostgreSQL's system relations (``pg_catalog.*``, ``information_schema.*``)
or it reads no relation at all (``SELECT version()``). Such a query runs on
the sanitized in-memory catalog (:mod:`dpsql.server.pgcatalog`), after a set
of small rewrites that translate PostgreSQL idioms DuckDB lacks: ``::regclass``
casts, ``OPERATOR(pg_catalog.~)``, ``COLLATE``, schema-qualified functions,
session functions such as ``current_user``. Only the functions listed here
may run, so a catalog query can reach nothing but the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

from dpsql.server.pgschema import CLIENT_TABLES, INFORMATION_SCHEMA, SEARCH_PATH, TABLES, VIEWS

PG_RELATIONS = frozenset(TABLES) | frozenset(VIEWS)
INFO_RELATIONS = frozenset(INFORMATION_SCHEMA)
TABLE_FUNCTIONS = frozenset({"generate_series", "unnest", "pg_get_keywords", "_pg_expandarray"})

# Functions a catalog query may call: the emulated PostgreSQL ones (macros in the catalog
# database) and plain scalar/aggregate built-ins that touch nothing outside the query.
MACRO_FUNCTIONS = frozenset({
    "pg_get_userbyid", "format_type", "pg_table_is_visible", "pg_type_is_visible",
    "pg_function_is_visible", "pg_collation_is_visible", "pg_opclass_is_visible",
    "pg_conversion_is_visible", "pg_get_expr", "pg_get_indexdef", "pg_get_constraintdef",
    "pg_get_viewdef", "pg_get_triggerdef", "pg_get_ruledef", "pg_get_partkeydef",
    "pg_get_function_result", "pg_get_function_arguments",
    "pg_get_function_identity_arguments", "pg_get_statisticsobjdef_columns",
    "pg_get_serial_sequence", "pg_relation_is_publishable", "pg_tablespace_location",
    "pg_encoding_to_char", "pg_char_to_encoding", "pg_is_in_recovery", "pg_table_size",
    "pg_relation_size", "pg_total_relation_size", "pg_indexes_size", "pg_database_size",
    "pg_size_pretty", "obj_description", "col_description", "shobj_description",
    "has_table_privilege", "has_column_privilege", "has_any_column_privilege",
    "has_schema_privilege", "has_database_privilege", "has_function_privilege",
    "has_sequence_privilege", "pg_has_role", "array_upper", "array_lower", "array_length",
    "quote_ident", "_pg_expandarray", "pg_get_keywords", "current_setting",
    "pg_operator_is_visible", "pg_statistics_obj_is_visible", "pg_ts_config_is_visible",
    "pg_ts_dict_is_visible", "pg_ts_parser_is_visible", "pg_ts_template_is_visible",
    "getdatabaseencoding", "to_regclass", "to_regtype", "to_regnamespace", "to_regrole",
})
BUILTIN_FUNCTIONS = frozenset({
    "all", "any", "array_to_string", "string_to_array", "array_position", "array_cat",
    "cardinality", "split_part", "strpos", "replace", "regexp_replace", "regexp_match",
    "translate", "initcap", "lpad", "rpad", "btrim", "format", "quote_literal", "to_char",
    "string_agg", "array_agg", "bool_and", "bool_or", "every", "unnest", "generate_series",
    "generate_subscripts", "row_number", "rank", "dense_rank", "lag", "lead", "first_value",
    "last_value", "md5", "chr", "ascii", "octet_length", "char_length", "character_length",
    "bit_length", "date_trunc", "date_part", "age", "to_timestamp", "abs", "ceil", "floor",
    "round", "trunc", "mod", "power", "sqrt", "sign", "div", "json_build_object",
    "jsonb_build_object",
})
# Built-ins DuckDB spells differently.
_RENAMED = {"json_build_object": "json_object", "jsonb_build_object": "json_object"}
# sqlglot's typed functions that must not run even on the catalog (files, settings, ...).
_FORBIDDEN_TYPED = ("read", "file", "glob", "copy", "attach", "load", "install", "export",
                    "import", "pragma", "setting", "getenv", "env", "system", "query")


class CatalogQueryError(Exception):
    """A catalog query uses something the emulated catalog does not offer."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@dataclass(frozen=True)
class Context:
    """Per-connection values session functions return."""

    user: str
    database: str
    settings: Mapping[str, str]
    pid: int
    version: str
    started: str
    cursors: tuple[tuple[str, bool], ...] = ()  # open SQL cursors: name, holdable


def _cte_names(tree: exp.Expr) -> set[str]:
    return {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}


def _table_function(table: exp.Table) -> str | None:
    """The name of the function a FROM item calls (None for a plain relation)."""
    func = table.this
    if isinstance(func, (exp.GenerateSeries, exp.ExplodingGenerateSeries)):
        return "generate_series"
    if isinstance(func, (exp.Unnest, exp.Explode)):
        return "unnest"
    if isinstance(func, exp.Anonymous):
        return str(func.this).lower()
    if isinstance(func, exp.Func):
        return func.sql_name().lower()
    return None


def is_catalog_query(tree: exp.Expr, user_relations: frozenset[str]) -> bool:
    """Whether ``tree`` is a plain query that reads system relations only (or nothing).

    ``user_relations`` are names of datasets and released tables: an unqualified
    name among them is the user's relation, never a system one. A system
    relation dpsql does not emulate still makes this a catalog query, so the
    client hears that the catalog lacks it.
    """
    if not isinstance(tree, exp.Query):
        return False
    ctes = _cte_names(tree)
    for table in tree.find_all(exp.Table):
        func = _table_function(table)
        if func is not None:
            if func not in TABLE_FUNCTIONS:
                return False
            continue
        name, schema = table.name.lower(), table.db.lower()
        if table.catalog:
            return False
        if schema in ("pg_catalog", "information_schema"):
            continue
        if schema or name in user_relations:
            return False
        if name in ctes or name.startswith("pg_"):
            continue
        return False
    return True


# -- default column names (PostgreSQL's FigureColname) -----------------------------------------


def _column_name(node: exp.Expr) -> str:
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Cast):
        inner = _column_name(node.this)
        if inner != "?column?":
            return inner
        target = node.to
        return target.sql("postgres").split(".")[-1].lower() if target else "?column?"
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
        return _column_name(node.expression)
    if isinstance(node, exp.Dot):
        return node.name
    if isinstance(node, exp.Case):
        return "case"
    if isinstance(node, exp.Exists):
        return "exists"
    if isinstance(node, exp.Array):
        return "array"
    if isinstance(node, exp.Boolean):
        return "bool"
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        special = {exp.CurrentUser: "current_user", exp.SessionUser: "session_user",
                   exp.CurrentSchema: "current_schema", exp.CurrentDatabase:
                   "current_database", exp.CurrentVersion: "version",
                   exp.CurrentCatalog: "current_catalog", exp.CurrentSchemas: "current_schemas",
                   exp.CurrentTimestamp: "current_timestamp"}
        for kind, name in special.items():
            if isinstance(node, kind):
                return name
        return node.sql_name().lower()
    if isinstance(node, exp.Paren):
        return _column_name(node.this)
    return "?column?"


def _name_columns(tree: exp.Expr) -> None:
    """Alias unnamed output columns as PostgreSQL would name them."""
    select = tree
    while isinstance(select, exp.SetOperation):
        select = select.this
    if not isinstance(select, exp.Select):
        return
    for projection in list(select.expressions):
        if isinstance(projection, (exp.Alias, exp.Star, exp.Column)) or \
                (isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)):
            continue
        if isinstance(projection, exp.Dot) and not isinstance(projection.expression, exp.Func):
            continue
        projection.replace(exp.alias_(projection.copy(), _column_name(projection), quoted=True))


# -- rewrites ----------------------------------------------------------------------------------

_TEXT_TYPES = {"text", "name", "varchar", "char", "bpchar", "sql_identifier", "character_data",
               "yes_or_no", "citext", "unknown"}
_INT_TYPES = {"int2": "SMALLINT", "smallint": "SMALLINT", "int4": "INTEGER",
              "integer": "INTEGER", "int": "INTEGER", "int8": "BIGINT", "bigint": "BIGINT",
              "cardinal_number": "INTEGER", "oid": "UINTEGER", "xid": "UINTEGER",
              "cid": "UINTEGER", "regoper": "UINTEGER", "regoperator": "UINTEGER",
              "float4": "REAL", "float8": "DOUBLE", "bool": "BOOLEAN", "boolean": "BOOLEAN",
              "numeric": "DECIMAL(38, 10)", "int2vector": "SMALLINT[]", "oidvector": "UINTEGER[]",
              "timestamptz": "TIMESTAMPTZ", "timestamp": "TIMESTAMP", "interval": "INTERVAL"}
_REG_TYPES = {"regclass", "regtype", "regnamespace", "regrole"}
_OPERATORS = {"~": (exp.RegexpLike, False), "!~": (exp.RegexpLike, True),
              "~*": (exp.RegexpILike, False), "!~*": (exp.RegexpILike, True),
              "~~": (exp.Like, False), "!~~": (exp.Like, True), "~~*": (exp.ILike, False),
              "!~~*": (exp.ILike, True), "=": (exp.EQ, False), "<>": (exp.NEQ, False)}


def _type_name(target: exp.Expr) -> str | None:
    """The PostgreSQL name of a cast target that sqlglot could not map (else None)."""
    if isinstance(target, exp.ObjectIdentifier):
        return target.name.lower()
    if isinstance(target, exp.DataType) and target.this == exp.DataType.Type.USERDEFINED:
        kind = target.args.get("kind")
        text = kind.sql("postgres") if isinstance(kind, exp.Expr) else str(kind or "")
        return text.split(".")[-1].strip('"').lower()
    return None


def _string_value(node: exp.Expr) -> str | None:
    if isinstance(node, exp.Literal) and node.is_string:
        return str(node.this)
    if isinstance(node, exp.Literal):
        return str(node.this)
    return None


def _array_literal(text: str, element: exp.DataType) -> exp.Expr:
    """A PostgreSQL array literal ('{a,"b c"}') as a DuckDB list."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise CatalogQueryError("22P02", f"malformed array literal: {text!r}")
    items, current, quoted, i = [], "", False, 1
    inner = body[1:-1]
    i = 0
    while i < len(inner):
        ch = inner[i]
        if ch == '"':
            quoted = not quoted
        elif ch == "\\" and quoted and i + 1 < len(inner):
            i += 1
            current += inner[i]
        elif ch == "," and not quoted:
            items.append(current)
            current = ""
        else:
            current += ch
        i += 1
    if inner:
        items.append(current)
    values: list[exp.Expr] = [
        exp.Null() if item.strip().upper() == "NULL" else
        exp.cast(exp.Literal.string(item.strip()), element.copy()) for item in items]
    return exp.Array(expressions=values)


def _duck_type(target: exp.Expr) -> exp.Expr:
    """A cast target DuckDB understands (PostgreSQL-only type names mapped, arrays too)."""
    name = _type_name(target)
    if name is None:
        if isinstance(target, exp.DataType) and target.this == exp.DataType.Type.ARRAY and \
                target.expressions:
            element = _duck_type(target.expressions[0])
            return exp.DataType.build(f"{element.sql('duckdb')}[]", dialect="duckdb")
        return target
    if name in _TEXT_TYPES:
        return exp.DataType.build("VARCHAR")
    if name in _INT_TYPES:
        return exp.DataType.build(_INT_TYPES[name], dialect="duckdb")
    raise CatalogQueryError("42704", f"type {name} does not exist in dpsql's catalog")


def _rewrite_cast(node: exp.Cast) -> exp.Expr:
    target = node.to
    name = _type_name(target)
    operand = node.this
    literal = _string_value(operand)
    if name in _REG_TYPES:
        if literal is not None:
            return exp.Anonymous(this=f"dpsql_{name}_oid", expressions=[exp.Literal.string(
                literal)])
        return exp.Anonymous(this=f"dpsql_{name}_name", expressions=[operand])
    if name in ("regproc", "regprocedure"):
        if literal is not None:
            return exp.Literal.string(literal.split(".")[-1].split("(")[0].strip('"'))
        return exp.cast(operand, "VARCHAR")
    mapped = _duck_type(target)
    if isinstance(mapped, exp.DataType) and mapped.this == exp.DataType.Type.ARRAY and \
            isinstance(operand, exp.Literal) and operand.is_string and mapped.expressions:
        return _array_literal(str(operand.this), mapped.expressions[0])
    return exp.Cast(this=operand, to=mapped)


def _rewrite_operator(node: exp.Operator) -> exp.Expr:
    symbol = str(node.args.get("operator", "")).split(".")[-1].strip()
    if symbol not in _OPERATORS:
        raise CatalogQueryError("42883", f"operator {symbol} is not available in catalog queries")
    kind, negate = _OPERATORS[symbol]
    result: exp.Expr = kind(this=node.this, expression=node.expression)
    return exp.Not(this=result) if negate else result


_SESSION_FUNCTIONS: dict[str, type[exp.Func]] = {
    "current_user": exp.CurrentUser, "session_user": exp.SessionUser,
    "current_schema": exp.CurrentSchema, "current_database": exp.CurrentDatabase,
    "current_catalog": exp.CurrentCatalog}


def _rewrite_function(node: exp.Expr, ctx: Context) -> exp.Expr:
    if isinstance(node, (exp.CurrentUser, exp.SessionUser)):
        return exp.Literal.string(ctx.user)
    if isinstance(node, exp.CurrentSchema):
        return exp.Literal.string(SEARCH_PATH[0])
    if isinstance(node, exp.CurrentSchemas):
        implicit = node.this
        names = (["pg_catalog"] if isinstance(implicit, exp.Boolean) and implicit.this else [])
        names += list(SEARCH_PATH)
        return exp.Array(expressions=[exp.Literal.string(n) for n in names])
    if isinstance(node, (exp.CurrentDatabase, exp.CurrentCatalog)):
        return exp.Literal.string(ctx.database)
    if isinstance(node, exp.Anonymous) and str(node.this).lower() in _SESSION_FUNCTIONS:
        return _rewrite_function(_SESSION_FUNCTIONS[str(node.this).lower()](), ctx)
    if isinstance(node, exp.CurrentVersion):
        return exp.Literal.string(ctx.version)
    if not isinstance(node, exp.Anonymous):
        typed = node.sql_name().lower() if isinstance(node, exp.Func) else ""
        if any(word in typed for word in _FORBIDDEN_TYPED):
            raise CatalogQueryError("42501", f"function {typed}() is not available over the "
                                    "wire")
        return node
    name = str(node.this).lower()
    if name == "version":
        return exp.Literal.string(ctx.version)
    if name == "set_config":
        return node.expressions[1].copy() if len(node.expressions) > 1 else exp.Null()
    if name == "pg_backend_pid":
        return exp.Literal.number(ctx.pid)
    if name in ("pg_postmaster_start_time", "pg_conf_load_time"):
        return exp.cast(exp.Literal.string(ctx.started), "TIMESTAMPTZ")
    if name in ("inet_server_addr", "inet_server_port", "inet_client_addr",
                "inet_client_port"):
        return exp.Null()
    if name in ("txid_current", "pg_current_xact_id"):
        return exp.Literal.number(1)
    if name in ("current_schemas",):
        return _rewrite_function(exp.CurrentSchemas(this=node.expressions[0]), ctx)
    if name in MACRO_FUNCTIONS or name in BUILTIN_FUNCTIONS:
        node.set("this", _RENAMED.get(name, name))
        return node
    raise CatalogQueryError("42883", f"function {name}() does not exist in dpsql's catalog")


def _rewrite_table(node: exp.Table, ctes: set[str]) -> exp.Expr:
    func = _table_function(node)
    if func is not None:
        node.set("db", None)
        alias = node.args.get("alias")
        if isinstance(alias, exp.TableAlias) and alias.name and not alias.columns:
            alias.set("columns", [exp.to_identifier(alias.name)])
        return node
    name, schema = node.name.lower(), node.db.lower()
    if not schema and name in ctes:
        return node
    known = INFO_RELATIONS if schema == "information_schema" else PG_RELATIONS
    if name not in known:
        raise CatalogQueryError("42P01", f'relation "{schema or "pg_catalog"}.{name}" does not '
                                "exist in dpsql's catalog")
    if schema == "information_schema":
        home = "pgis"
    elif name in CLIENT_TABLES:
        home = "temp"
    else:
        home = "pgc"
    node.set("db", exp.to_identifier(home))
    node.set("this", exp.to_identifier(name))
    return node


def rewrite(tree: exp.Expr, ctx: Context) -> str:
    """DuckDB SQL for a catalog query (``is_catalog_query(tree)`` must hold)."""
    tree = normalize_identifiers(tree.copy(), dialect="postgres")
    _name_columns(tree)
    ctes = _cte_names(tree)
    for node in reversed(list(tree.walk(bfs=False))):
        replacement: exp.Expr | None = None
        if isinstance(node, exp.Collate):
            replacement = node.this
        elif isinstance(node, exp.Operator):
            replacement = _rewrite_operator(node)
        elif isinstance(node, exp.Cast):
            replacement = _rewrite_cast(node)
        elif isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) and \
                node.this.name.lower() in ("pg_catalog", "information_schema") and \
                not isinstance(node.expression, exp.Identifier):
            replacement = node.expression
        elif isinstance(node, exp.Table):
            replacement = _rewrite_table(node, ctes)
        elif isinstance(node, exp.Func) and not isinstance(node.parent, exp.Table):
            replacement = _rewrite_function(node, ctx)
        elif isinstance(node, exp.Column) and node.db.lower() in ("pg_catalog",
                                                                 "information_schema"):
            node.set("db", None)  # pg_catalog.pg_class.oid: the table name binds it alone
            replacement = node
        elif isinstance(node, exp.Column) and not node.table and \
                not node.this.args.get("quoted") and node.name in ("user", "current_role"):
            replacement = exp.Literal.string(ctx.user)
        if replacement is not None and replacement is not node:
            node.replace(replacement)
            if node is tree:
                tree = replacement
    return tree.sql("duckdb")


def parse(text: str) -> exp.Expr | None:
    """The statement as a sqlglot tree in PostgreSQL's dialect (None if it does not parse)."""
    try:
        trees = sqlglot.parse(text, read="postgres")
    except (sqlglot.errors.SqlglotError, RecursionError):  # the session refuses it clearly
        return None
    if len(trees) != 1 or trees[0] is None:
        return None
    return trees[0]
