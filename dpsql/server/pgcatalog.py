"""The emulated ``pg_catalog`` and ``information_schema``: tables, rows and functions.

SQL clients learn what exists by querying PostgreSQL's system catalogs. dpsql
answers those queries from a small in-memory DuckDB database built here, per
client connection, from a sanitized description of the store (see
:mod:`dpsql.server.catalog`): schemas, table names, column names and types, and
comments. It never holds a row, a row count, a size or a statistic of a
private table: ``reltuples`` is -1 (unknown) and size functions return NULL.

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

from dpsql.server.pgtypes import TYPES, from_duckdb

OWNER = "dpsql"
OWNER_OID = 10
NAMESPACES = {"pg_catalog": 11, "public": 2200, "information_schema": 13000, "released": 16385}
SEARCH_PATH = ("public", "released")
DATABASE_OID = 16384

# Columns of each emulated relation, as in PostgreSQL 15 (types: DuckDB).
_O, _B, _S, _I2, _I4, _F4 = "UINTEGER", "BOOLEAN", "VARCHAR", "SMALLINT", "INTEGER", "REAL"
TABLES: dict[str, list[tuple[str, str]]] = {
    "pg_namespace": [("oid", _O), ("nspname", _S), ("nspowner", _O), ("nspacl", "VARCHAR[]")],
    "pg_class": [
        ("oid", _O), ("relname", _S), ("relnamespace", _O), ("reltype", _O),
        ("reloftype", _O), ("relowner", _O), ("relam", _O), ("relfilenode", _O),
        ("reltablespace", _O), ("relpages", _I4), ("reltuples", _F4), ("relallvisible", _I4),
        ("reltoastrelid", _O), ("relhasindex", _B), ("relisshared", _B), ("relpersistence", _S),
        ("relkind", _S), ("relnatts", _I2), ("relchecks", _I2), ("relhasrules", _B),
        ("relhastriggers", _B), ("relhassubclass", _B), ("relrowsecurity", _B),
        ("relforcerowsecurity", _B), ("relispopulated", _B), ("relreplident", _S),
        ("relispartition", _B), ("relrewrite", _O), ("relfrozenxid", _O), ("relminmxid", _O),
        ("relacl", "VARCHAR[]"), ("reloptions", "VARCHAR[]"), ("relpartbound", _S)],
    "pg_attribute": [
        ("attrelid", _O), ("attname", _S), ("atttypid", _O), ("attstattarget", _I4),
        ("attlen", _I2), ("attnum", _I2), ("attndims", _I4), ("attcacheoff", _I4),
        ("atttypmod", _I4), ("attbyval", _B), ("attalign", _S), ("attstorage", _S),
        ("attcompression", _S), ("attnotnull", _B), ("atthasdef", _B), ("atthasmissing", _B),
        ("attidentity", _S), ("attgenerated", _S), ("attisdropped", _B), ("attislocal", _B),
        ("attinhcount", _I4), ("attcollation", _O), ("attacl", "VARCHAR[]"),
        ("attoptions", "VARCHAR[]"), ("attfdwoptions", "VARCHAR[]"), ("attmissingval", _S)],
    "pg_type": [
        ("oid", _O), ("typname", _S), ("typnamespace", _O), ("typowner", _O), ("typlen", _I2),
        ("typbyval", _B), ("typtype", _S), ("typcategory", _S), ("typispreferred", _B),
        ("typisdefined", _B), ("typdelim", _S), ("typrelid", _O), ("typsubscript", _S),
        ("typelem", _O), ("typarray", _O), ("typinput", _S), ("typoutput", _S),
        ("typreceive", _S), ("typsend", _S), ("typmodin", _S), ("typmodout", _S),
        ("typanalyze", _S), ("typalign", _S), ("typstorage", _S), ("typnotnull", _B),
        ("typbasetype", _O), ("typtypmod", _I4), ("typndims", _I4), ("typcollation", _O),
        ("typdefaultbin", _S), ("typdefault", _S), ("typacl", "VARCHAR[]")],
    "pg_am": [("oid", _O), ("amname", _S), ("amhandler", _S), ("amtype", _S)],
    "pg_database": [
        ("oid", _O), ("datname", _S), ("datdba", _O), ("encoding", _I4), ("datlocprovider", _S),
        ("datistemplate", _B), ("datallowconn", _B), ("datconnlimit", _I4),
        ("datfrozenxid", _O), ("datminmxid", _O), ("dattablespace", _O), ("datcollate", _S),
        ("datctype", _S), ("daticulocale", _S), ("datcollversion", _S), ("datacl", "VARCHAR[]")],
    "pg_roles": [
        ("rolname", _S), ("rolsuper", _B), ("rolinherit", _B), ("rolcreaterole", _B),
        ("rolcreatedb", _B), ("rolcanlogin", _B), ("rolreplication", _B),
        ("rolconnlimit", _I4), ("rolpassword", _S), ("rolvaliduntil", "TIMESTAMPTZ"),
        ("rolbypassrls", _B), ("rolconfig", "VARCHAR[]"), ("oid", _O)],
    "pg_user": [
        ("usename", _S), ("usesysid", _O), ("usecreatedb", _B), ("usesuper", _B),
        ("userepl", _B), ("usebypassrls", _B), ("passwd", _S), ("valuntil", "TIMESTAMPTZ"),
        ("useconfig", "VARCHAR[]")],
    "pg_auth_members": [("roleid", _O), ("member", _O), ("grantor", _O), ("admin_option", _B)],
    "pg_settings": [
        ("name", _S), ("setting", _S), ("unit", _S), ("category", _S), ("short_desc", _S),
        ("extra_desc", _S), ("context", _S), ("vartype", _S), ("source", _S), ("min_val", _S),
        ("max_val", _S), ("enumvals", "VARCHAR[]"), ("boot_val", _S), ("reset_val", _S),
        ("sourcefile", _S), ("sourceline", _I4), ("pending_restart", _B)],
    "pg_description": [("objoid", _O), ("classoid", _O), ("objsubid", _I4), ("description", _S)],
    "pg_shdescription": [("objoid", _O), ("classoid", _O), ("description", _S)],
    "pg_index": [
        ("indexrelid", _O), ("indrelid", _O), ("indnatts", _I2), ("indnkeyatts", _I2),
        ("indisunique", _B), ("indnullsnotdistinct", _B), ("indisprimary", _B),
        ("indisexclusion", _B), ("indimmediate", _B), ("indisclustered", _B),
        ("indisvalid", _B), ("indcheckxmin", _B), ("indisready", _B), ("indislive", _B),
        ("indisreplident", _B), ("indkey", "SMALLINT[]"), ("indcollation", "UINTEGER[]"),
        ("indclass", "UINTEGER[]"), ("indoption", "SMALLINT[]"), ("indexprs", _S),
        ("indpred", _S)],
    "pg_constraint": [
        ("oid", _O), ("conname", _S), ("connamespace", _O), ("contype", _S),
        ("condeferrable", _B), ("condeferred", _B), ("convalidated", _B), ("conrelid", _O),
        ("contypid", _O), ("conindid", _O), ("conparentid", _O), ("confrelid", _O),
        ("confupdtype", _S), ("confdeltype", _S), ("confmatchtype", _S), ("conislocal", _B),
        ("coninhcount", _I4), ("connoinherit", _B), ("conkey", "SMALLINT[]"),
        ("confkey", "SMALLINT[]"), ("conpfeqop", "UINTEGER[]"), ("conppeqop", "UINTEGER[]"),
        ("conffeqop", "UINTEGER[]"), ("confdelsetcols", "SMALLINT[]"),
        ("conexclop", "UINTEGER[]"), ("conbin", _S)],
    "pg_attrdef": [("oid", _O), ("adrelid", _O), ("adnum", _I2), ("adbin", _S)],
    "pg_inherits": [("inhrelid", _O), ("inhparent", _O), ("inhseqno", _I4),
                    ("inhdetachpending", _B)],
    "pg_partitioned_table": [("partrelid", _O), ("partstrat", _S), ("partnatts", _I2),
                             ("partdefid", _O), ("partattrs", "SMALLINT[]")],
    "pg_policy": [("oid", _O), ("polname", _S), ("polrelid", _O), ("polcmd", _S),
                  ("polpermissive", _B), ("polroles", "UINTEGER[]"), ("polqual", _S),
                  ("polwithcheck", _S)],
    "pg_statistic_ext": [("oid", _O), ("stxrelid", _O), ("stxname", _S), ("stxnamespace", _O),
                         ("stxowner", _O), ("stxstattarget", _I4), ("stxkeys", "SMALLINT[]"),
                         ("stxkind", "VARCHAR[]"), ("stxexprs", _S)],
    "pg_publication": [("oid", _O), ("pubname", _S), ("pubowner", _O), ("puballtables", _B),
                       ("pubinsert", _B), ("pubupdate", _B), ("pubdelete", _B),
                       ("pubtruncate", _B), ("pubviaroot", _B)],
    "pg_publication_rel": [("oid", _O), ("prpubid", _O), ("prrelid", _O), ("prqual", _S),
                           ("prattrs", "SMALLINT[]")],
    "pg_publication_namespace": [("oid", _O), ("pnpubid", _O), ("pnnspid", _O)],
    "pg_trigger": [
        ("oid", _O), ("tgrelid", _O), ("tgparentid", _O), ("tgname", _S), ("tgfoid", _O),
        ("tgtype", _I2), ("tgenabled", _S), ("tgisinternal", _B), ("tgconstrrelid", _O),
        ("tgconstrindid", _O), ("tgconstraint", _O), ("tgdeferrable", _B),
        ("tginitdeferred", _B), ("tgnargs", _I2), ("tgattr", "SMALLINT[]"), ("tgargs", _S),
        ("tgqual", _S), ("tgoldtable", _S), ("tgnewtable", _S)],
    "pg_rewrite": [("oid", _O), ("rulename", _S), ("ev_class", _O), ("ev_type", _S),
                   ("ev_enabled", _S), ("is_instead", _B), ("ev_qual", _S), ("ev_action", _S)],
    "pg_depend": [("classid", _O), ("objid", _O), ("objsubid", _I4), ("refclassid", _O),
                  ("refobjid", _O), ("refobjsubid", _I4), ("deptype", _S)],
    "pg_proc": [
        ("oid", _O), ("proname", _S), ("pronamespace", _O), ("proowner", _O), ("prolang", _O),
        ("procost", _F4), ("prorows", _F4), ("provariadic", _O), ("prosupport", _S),
        ("prokind", _S), ("prosecdef", _B), ("proleakproof", _B), ("proisstrict", _B),
        ("proretset", _B), ("provolatile", _S), ("proparallel", _S), ("pronargs", _I2),
        ("pronargdefaults", _I2), ("prorettype", _O), ("proargtypes", "UINTEGER[]"),
        ("proallargtypes", "UINTEGER[]"), ("proargmodes", "VARCHAR[]"),
        ("proargnames", "VARCHAR[]"), ("proargdefaults", _S), ("protrftypes", "UINTEGER[]"),
        ("prosrc", _S), ("probin", _S), ("prosqlbody", _S), ("proconfig", "VARCHAR[]"),
        ("proacl", "VARCHAR[]")],
    "pg_collation": [("oid", _O), ("collname", _S), ("collnamespace", _O), ("collowner", _O),
                     ("collprovider", _S), ("collisdeterministic", _B), ("collencoding", _I4),
                     ("collcollate", _S), ("collctype", _S), ("colliculocale", _S),
                     ("collversion", _S)],
    "pg_tablespace": [("oid", _O), ("spcname", _S), ("spcowner", _O), ("spcacl", "VARCHAR[]"),
                      ("spcoptions", "VARCHAR[]")],
    "pg_extension": [("oid", _O), ("extname", _S), ("extowner", _O), ("extnamespace", _O),
                     ("extrelocatable", _B), ("extversion", _S), ("extconfig", "UINTEGER[]"),
                     ("extcondition", "VARCHAR[]")],
    "pg_language": [("oid", _O), ("lanname", _S), ("lanowner", _O), ("lanispl", _B),
                    ("lanpltrusted", _B), ("lanplcallfoid", _O), ("laninline", _O),
                    ("lanvalidator", _O), ("lanacl", "VARCHAR[]")],
    "pg_enum": [("oid", _O), ("enumtypid", _O), ("enumsortorder", _F4), ("enumlabel", _S)],
    "pg_operator": [("oid", _O), ("oprname", _S), ("oprnamespace", _O), ("oprowner", _O),
                    ("oprkind", _S), ("oprleft", _O), ("oprright", _O), ("oprresult", _O),
                    ("oprcode", _S)],
    "pg_opclass": [("oid", _O), ("opcmethod", _O), ("opcname", _S), ("opcnamespace", _O),
                   ("opcowner", _O), ("opcfamily", _O), ("opcintype", _O), ("opcdefault", _B),
                   ("opckeytype", _O)],
    "pg_cast": [("oid", _O), ("castsource", _O), ("casttarget", _O), ("castfunc", _O),
                ("castcontext", _S), ("castmethod", _S)],
    "pg_aggregate": [("aggfnoid", _S), ("aggkind", _S), ("aggnumdirectargs", _I2),
                     ("aggtransfn", _S), ("aggfinalfn", _S), ("aggtranstype", _O)],
    "pg_sequence": [("seqrelid", _O), ("seqtypid", _O), ("seqstart", "BIGINT"),
                    ("seqincrement", "BIGINT"), ("seqmax", "BIGINT"), ("seqmin", "BIGINT"),
                    ("seqcache", "BIGINT"), ("seqcycle", _B)],
    "pg_foreign_table": [("ftrelid", _O), ("ftserver", _O), ("ftoptions", "VARCHAR[]")],
    "pg_foreign_server": [("oid", _O), ("srvname", _S), ("srvowner", _O), ("srvfdw", _O),
                          ("srvtype", _S), ("srvversion", _S), ("srvacl", "VARCHAR[]"),
                          ("srvoptions", "VARCHAR[]")],
    "pg_foreign_data_wrapper": [("oid", _O), ("fdwname", _S), ("fdwowner", _O),
                                ("fdwhandler", _O), ("fdwvalidator", _O),
                                ("fdwacl", "VARCHAR[]"), ("fdwoptions", "VARCHAR[]")],
    "pg_event_trigger": [("oid", _O), ("evtname", _S), ("evtevent", _S), ("evtowner", _O),
                         ("evtfoid", _O), ("evtenabled", _S), ("evttags", "VARCHAR[]")],
    "pg_conversion": [("oid", _O), ("conname", _S), ("connamespace", _O), ("conowner", _O),
                      ("conforencoding", _I4), ("contoencoding", _I4), ("conproc", _S),
                      ("condefault", _B)],
    "pg_timezone_names": [("name", _S), ("abbrev", _S), ("utc_offset", "INTERVAL"),
                          ("is_dst", _B)],
    "pg_timezone_abbrevs": [("abbrev", _S), ("utc_offset", "INTERVAL"), ("is_dst", _B)],
    "pg_default_acl": [("oid", _O), ("defaclrole", _O), ("defaclnamespace", _O),
                       ("defaclobjtype", _S), ("defaclacl", "VARCHAR[]")],
    "pg_db_role_setting": [("setdatabase", _O), ("setrole", _O), ("setconfig", "VARCHAR[]")],
    "pg_user_mappings": [("umid", _O), ("srvid", _O), ("srvname", _S), ("umuser", _O),
                         ("usename", _S), ("umoptions", "VARCHAR[]")],
    "pg_user_mapping": [("oid", _O), ("umuser", _O), ("umserver", _O),
                        ("umoptions", "VARCHAR[]")],
    "pg_subscription": [("oid", _O), ("subdbid", _O), ("subskiplsn", _S), ("subname", _S),
                        ("subowner", _O), ("subenabled", _B), ("subbinary", _B),
                        ("substream", _B), ("subtwophasestate", _S), ("subdisableonerr", _B),
                        ("subconninfo", _S), ("subslotname", _S), ("subsynccommit", _S),
                        ("subpublications", "VARCHAR[]")],
    "pg_ts_config": [("oid", _O), ("cfgname", _S), ("cfgnamespace", _O), ("cfgowner", _O),
                     ("cfgparser", _O)],
    "pg_ts_dict": [("oid", _O), ("dictname", _S), ("dictnamespace", _O), ("dictowner", _O),
                   ("dicttemplate", _O), ("dictinitoption", _S)],
    "pg_ts_parser": [("oid", _O), ("prsname", _S), ("prsnamespace", _O), ("prsstart", _S),
                     ("prstoken", _S), ("prsend", _S), ("prsheadline", _S),
                     ("prslextype", _S)],
    "pg_ts_template": [("oid", _O), ("tmplname", _S), ("tmplnamespace", _O),
                       ("tmplinit", _S), ("tmpllexize", _S)],
    "pg_statistic_ext_data": [("stxoid", _O), ("stxdinherit", _B)],
    "pg_opfamily": [("oid", _O), ("opfmethod", _O), ("opfname", _S), ("opfnamespace", _O),
                    ("opfowner", _O)],
    "pg_amop": [("oid", _O), ("amopfamily", _O), ("amoplefttype", _O),
                ("amoprighttype", _O), ("amopstrategy", _I2), ("amoppurpose", _S),
                ("amopopr", _O), ("amopmethod", _O), ("amopsortfamily", _O)],
    "pg_amproc": [("oid", _O), ("amprocfamily", _O), ("amproclefttype", _O),
                  ("amprocrighttype", _O), ("amprocnum", _I2), ("amproc", _S)],
    "pg_range": [("rngtypid", _O), ("rngsubtype", _O), ("rngmultitypid", _O),
                 ("rngcollation", _O), ("rngsubopc", _O), ("rngcanonical", _S),
                 ("rngsubdiff", _S)],
    "pg_largeobject_metadata": [("oid", _O), ("lomowner", _O), ("lomacl", "VARCHAR[]")],
    "pg_transform": [("oid", _O), ("trftype", _O), ("trflang", _O), ("trffromsql", _S),
                     ("trftosql", _S)],
    "pg_init_privs": [("objoid", _O), ("classoid", _O), ("objsubid", _I4), ("privtype", _S),
                      ("initprivs", "VARCHAR[]")],
}
TABLES["pg_authid"] = TABLES["pg_roles"]
# Tables whose rows describe the connected client: one copy per connection (temp tables).
CLIENT_TABLES = ("pg_roles", "pg_authid", "pg_user", "pg_database", "pg_settings")

# Views over the tables (PostgreSQL has them as views too).
VIEWS: dict[str, str] = {
    "pg_tables": """SELECT n.nspname AS schemaname, c.relname AS tablename,
        pg_get_userbyid(c.relowner) AS tableowner, NULL::VARCHAR AS tablespace,
        c.relhasindex AS hasindexes, c.relhasrules AS hasrules,
        c.relhastriggers AS hastriggers, c.relrowsecurity AS rowsecurity
        FROM pgc.pg_class c JOIN pgc.pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind IN ('r', 'p')""",
    "pg_views": """SELECT NULL::VARCHAR AS schemaname, NULL::VARCHAR AS viewname,
        NULL::VARCHAR AS viewowner, NULL::VARCHAR AS definition WHERE false""",
    "pg_matviews": """SELECT NULL::VARCHAR AS schemaname, NULL::VARCHAR AS matviewname,
        NULL::VARCHAR AS matviewowner, NULL::VARCHAR AS tablespace, false AS hasindexes,
        false AS ispopulated, NULL::VARCHAR AS definition WHERE false""",
    "pg_indexes": """SELECT NULL::VARCHAR AS schemaname, NULL::VARCHAR AS tablename,
        NULL::VARCHAR AS indexname, NULL::VARCHAR AS tablespace, NULL::VARCHAR AS indexdef
        WHERE false""",
    "pg_sequences": """SELECT NULL::VARCHAR AS schemaname, NULL::VARCHAR AS sequencename,
        NULL::VARCHAR AS sequenceowner, NULL::UINTEGER AS data_type, NULL::BIGINT AS start_value,
        NULL::BIGINT AS min_value, NULL::BIGINT AS max_value, NULL::BIGINT AS increment_by,
        false AS cycle, NULL::BIGINT AS cache_size, NULL::BIGINT AS last_value WHERE false""",
}

_DB = "(SELECT datname FROM temp.pg_database LIMIT 1)"
INFORMATION_SCHEMA: dict[str, str] = {
    "schemata": f"""SELECT {_DB} AS catalog_name, nspname AS schema_name,
        '{OWNER}' AS schema_owner, NULL::VARCHAR AS default_character_set_catalog,
        NULL::VARCHAR AS default_character_set_schema,
        NULL::VARCHAR AS default_character_set_name, NULL::VARCHAR AS sql_path
        FROM pgc.pg_namespace""",
    "tables": f"""SELECT {_DB} AS table_catalog, n.nspname AS table_schema,
        c.relname AS table_name,
        CASE WHEN c.relkind = 'v' THEN 'VIEW' ELSE 'BASE TABLE' END AS table_type,
        NULL::VARCHAR AS self_referencing_column_name, NULL::VARCHAR AS reference_generation,
        NULL::VARCHAR AS user_defined_type_catalog, NULL::VARCHAR AS user_defined_type_schema,
        NULL::VARCHAR AS user_defined_type_name, 'NO' AS is_insertable_into,
        'NO' AS is_typed, NULL::VARCHAR AS commit_action
        FROM pgc.pg_class c JOIN pgc.pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind IN ('r', 'v', 'p')""",
    "columns": f"""SELECT {_DB} AS table_catalog, n.nspname AS table_schema,
        c.relname AS table_name, a.attname AS column_name, a.attnum::INTEGER AS ordinal_position,
        NULL::VARCHAR AS column_default,
        CASE WHEN a.attnotnull THEN 'NO' ELSE 'YES' END AS is_nullable,
        CASE WHEN t.typcategory = 'A' THEN 'ARRAY' ELSE format_type(a.atttypid, NULL) END
            AS data_type,
        NULL::INTEGER AS character_maximum_length, NULL::INTEGER AS character_octet_length,
        CASE t.typname WHEN 'int2' THEN 16 WHEN 'int4' THEN 32 WHEN 'int8' THEN 64
            WHEN 'float4' THEN 24 WHEN 'float8' THEN 53
            WHEN 'numeric' THEN CASE WHEN a.atttypmod > 0 THEN (a.atttypmod - 4) >> 16 END
            END AS numeric_precision,
        CASE WHEN t.typname IN ('int2', 'int4', 'int8', 'float4', 'float8') THEN 2
            WHEN t.typname = 'numeric' THEN 10 END AS numeric_precision_radix,
        CASE WHEN t.typname IN ('int2', 'int4', 'int8') THEN 0
            WHEN t.typname = 'numeric' AND a.atttypmod > 0 THEN (a.atttypmod - 4) & 65535
            END AS numeric_scale,
        CASE WHEN t.typcategory = 'D' THEN 6 END AS datetime_precision,
        NULL::VARCHAR AS interval_type, NULL::INTEGER AS interval_precision,
        NULL::VARCHAR AS character_set_catalog, NULL::VARCHAR AS character_set_schema,
        NULL::VARCHAR AS character_set_name, NULL::VARCHAR AS collation_catalog,
        NULL::VARCHAR AS collation_schema, NULL::VARCHAR AS collation_name,
        NULL::VARCHAR AS domain_catalog, NULL::VARCHAR AS domain_schema,
        NULL::VARCHAR AS domain_name, {_DB} AS udt_catalog, 'pg_catalog' AS udt_schema,
        t.typname AS udt_name, NULL::VARCHAR AS scope_catalog, NULL::VARCHAR AS scope_schema,
        NULL::VARCHAR AS scope_name, NULL::INTEGER AS maximum_cardinality,
        a.attnum::VARCHAR AS dtd_identifier, 'NO' AS is_self_referencing, 'NO' AS is_identity,
        NULL::VARCHAR AS identity_generation, NULL::VARCHAR AS identity_start,
        NULL::VARCHAR AS identity_increment, NULL::VARCHAR AS identity_maximum,
        NULL::VARCHAR AS identity_minimum, NULL::VARCHAR AS identity_cycle,
        'NEVER' AS is_generated, NULL::VARCHAR AS generation_expression, 'NO' AS is_updatable
        FROM pgc.pg_attribute a JOIN pgc.pg_class c ON c.oid = a.attrelid
        JOIN pgc.pg_namespace n ON n.oid = c.relnamespace
        JOIN pgc.pg_type t ON t.oid = a.atttypid
        WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'v', 'p')""",
    "views": """SELECT NULL::VARCHAR AS table_catalog, NULL::VARCHAR AS table_schema,
        NULL::VARCHAR AS table_name, NULL::VARCHAR AS view_definition,
        NULL::VARCHAR AS check_option, 'NO' AS is_updatable, 'NO' AS is_insertable_into,
        'NO' AS is_trigger_updatable, 'NO' AS is_trigger_deletable,
        'NO' AS is_trigger_insertable_into WHERE false""",
    "table_constraints": """SELECT NULL::VARCHAR AS constraint_catalog,
        NULL::VARCHAR AS constraint_schema, NULL::VARCHAR AS constraint_name,
        NULL::VARCHAR AS table_catalog, NULL::VARCHAR AS table_schema,
        NULL::VARCHAR AS table_name, NULL::VARCHAR AS constraint_type,
        NULL::VARCHAR AS is_deferrable, NULL::VARCHAR AS initially_deferred,
        NULL::VARCHAR AS enforced, NULL::VARCHAR AS nulls_distinct WHERE false""",
    "key_column_usage": """SELECT NULL::VARCHAR AS constraint_catalog,
        NULL::VARCHAR AS constraint_schema, NULL::VARCHAR AS constraint_name,
        NULL::VARCHAR AS table_catalog, NULL::VARCHAR AS table_schema,
        NULL::VARCHAR AS table_name, NULL::VARCHAR AS column_name,
        NULL::INTEGER AS ordinal_position, NULL::INTEGER AS position_in_unique_constraint
        WHERE false""",
    "constraint_column_usage": """SELECT NULL::VARCHAR AS table_catalog,
        NULL::VARCHAR AS table_schema, NULL::VARCHAR AS table_name,
        NULL::VARCHAR AS column_name, NULL::VARCHAR AS constraint_catalog,
        NULL::VARCHAR AS constraint_schema, NULL::VARCHAR AS constraint_name WHERE false""",
    "referential_constraints": """SELECT NULL::VARCHAR AS constraint_catalog,
        NULL::VARCHAR AS constraint_schema, NULL::VARCHAR AS constraint_name,
        NULL::VARCHAR AS unique_constraint_catalog, NULL::VARCHAR AS unique_constraint_schema,
        NULL::VARCHAR AS unique_constraint_name, NULL::VARCHAR AS match_option,
        NULL::VARCHAR AS update_rule, NULL::VARCHAR AS delete_rule WHERE false""",
    "check_constraints": """SELECT NULL::VARCHAR AS constraint_catalog,
        NULL::VARCHAR AS constraint_schema, NULL::VARCHAR AS constraint_name,
        NULL::VARCHAR AS check_clause WHERE false""",
    "routines": """SELECT NULL::VARCHAR AS specific_catalog, NULL::VARCHAR AS specific_schema,
        NULL::VARCHAR AS specific_name, NULL::VARCHAR AS routine_catalog,
        NULL::VARCHAR AS routine_schema, NULL::VARCHAR AS routine_name,
        NULL::VARCHAR AS routine_type, NULL::VARCHAR AS data_type,
        NULL::VARCHAR AS routine_definition, NULL::VARCHAR AS external_language WHERE false""",
    "parameters": """SELECT NULL::VARCHAR AS specific_catalog, NULL::VARCHAR AS specific_schema,
        NULL::VARCHAR AS specific_name, NULL::INTEGER AS ordinal_position,
        NULL::VARCHAR AS parameter_mode, NULL::VARCHAR AS parameter_name,
        NULL::VARCHAR AS data_type WHERE false""",
    "sequences": """SELECT NULL::VARCHAR AS sequence_catalog, NULL::VARCHAR AS sequence_schema,
        NULL::VARCHAR AS sequence_name, NULL::VARCHAR AS data_type WHERE false""",
    "triggers": """SELECT NULL::VARCHAR AS trigger_catalog, NULL::VARCHAR AS trigger_schema,
        NULL::VARCHAR AS trigger_name, NULL::VARCHAR AS event_manipulation,
        NULL::VARCHAR AS event_object_schema, NULL::VARCHAR AS event_object_table,
        NULL::VARCHAR AS action_statement, NULL::VARCHAR AS action_timing WHERE false""",
    "character_sets": f"""SELECT NULL::VARCHAR AS character_set_catalog,
        NULL::VARCHAR AS character_set_schema, 'UTF8' AS character_set_name,
        'UCS' AS character_repertoire, 'UTF8' AS form_of_use,
        {_DB} AS default_collate_catalog, 'pg_catalog' AS default_collate_schema,
        'C' AS default_collate_name""",
    "enabled_roles": "SELECT rolname AS role_name FROM temp.pg_roles",
    "applicable_roles": """SELECT rolname AS grantee, rolname AS role_name,
        'NO' AS is_grantable FROM temp.pg_roles""",
}

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


def set_settings(con: duckdb.DuckDBPyConnection, settings: Mapping[str, str]) -> None:
    """Replace the rows of pg_settings with the connection's current parameters."""
    con.execute("DELETE FROM temp.pg_settings")
    _insert(con, "pg_settings", [_full("pg_settings", {
        "name": name, "setting": value, "category": "Client Connection Defaults",
        "context": "user", "vartype": "string", "source": "session", "boot_val": value,
        "reset_val": value, "pending_restart": False}) for name, value in settings.items()])
