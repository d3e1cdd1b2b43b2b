"""Catalog queries real clients send, as their sources write them.

pgjdbc: ``PgDatabaseMetaData`` (getTables, getSchemas, getColumns, getPrimaryKeys,
getImportedKeys, getTypeInfo) and ``TypeInfoCache``; DBeaver: the PostgreSQL
plugin's navigator loaders (``PostgreDataSource``, ``PostgreDatabase``,
``PostgreSchema``), which pgjdbc sends as prepared statements with ``$n``
parameters. Each entry: (name, SQL, parameters).
"""

from __future__ import annotations

_JDBC_TABLE_TYPE = """ CASE n.nspname ~ '^pg_' OR n.nspname = 'information_schema'
 WHEN true THEN CASE
 WHEN n.nspname = 'pg_catalog' OR n.nspname = 'information_schema' THEN CASE c.relkind
  WHEN 'r' THEN 'SYSTEM TABLE' WHEN 'v' THEN 'SYSTEM VIEW' WHEN 'i' THEN 'SYSTEM INDEX'
  ELSE NULL END
 WHEN n.nspname = 'pg_toast' THEN CASE c.relkind
  WHEN 'r' THEN 'SYSTEM TOAST TABLE' WHEN 'i' THEN 'SYSTEM TOAST INDEX' ELSE NULL END
 ELSE CASE c.relkind WHEN 'r' THEN 'TEMPORARY TABLE' WHEN 'p' THEN 'TEMPORARY TABLE'
  WHEN 'i' THEN 'TEMPORARY INDEX' WHEN 'S' THEN 'TEMPORARY SEQUENCE'
  WHEN 'v' THEN 'TEMPORARY VIEW' ELSE NULL END END
 WHEN false THEN CASE c.relkind WHEN 'r' THEN 'TABLE' WHEN 'p' THEN 'PARTITIONED TABLE'
 WHEN 'i' THEN 'INDEX' WHEN 'P' then 'PARTITIONED INDEX' WHEN 'S' THEN 'SEQUENCE'
 WHEN 'v' THEN 'VIEW' WHEN 'c' THEN 'TYPE' WHEN 'f' THEN 'FOREIGN TABLE'
 WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE NULL END ELSE NULL END """

JDBC_GET_TABLES = ("SELECT NULL AS TABLE_CAT, n.nspname AS TABLE_SCHEM, c.relname AS TABLE_NAME, "
                   + _JDBC_TABLE_TYPE + " AS TABLE_TYPE, d.description AS REMARKS, "
                   "'' as TYPE_CAT, '' as TYPE_SCHEM, '' as TYPE_NAME, "
                   "'' AS SELF_REFERENCING_COL_NAME, '' AS REF_GENERATION "
                   " FROM pg_catalog.pg_namespace n, pg_catalog.pg_class c "
                   " LEFT JOIN pg_catalog.pg_description d ON (c.oid = d.objoid AND "
                   "d.objsubid = 0) "
                   " LEFT JOIN pg_catalog.pg_class dc ON (d.classoid=dc.oid AND "
                   "dc.relname='pg_class') "
                   " LEFT JOIN pg_catalog.pg_namespace dn ON (dn.oid=dc.relnamespace AND "
                   "dn.nspname='pg_catalog') "
                   " WHERE c.relnamespace = n.oid  AND c.relname LIKE '%' AND (false "
                   " OR ( c.relkind = 'r' AND n.nspname !~ '^pg_' AND n.nspname <> "
                   "'information_schema' ) ) "
                   " ORDER BY TABLE_TYPE,TABLE_SCHEM,TABLE_NAME ")

JDBC_GET_SCHEMAS = (
    "SELECT nspname AS TABLE_SCHEM, NULL AS TABLE_CATALOG FROM pg_catalog.pg_namespace "
    " WHERE nspname <> 'pg_toast' AND (nspname !~ '^pg_temp_' "
    " OR nspname = (pg_catalog.current_schemas(true))[1]) AND (nspname !~ '^pg_toast_temp_' "
    " OR nspname = replace((pg_catalog.current_schemas(true))[1], 'pg_temp_', "
    "'pg_toast_temp_'))  ORDER BY TABLE_SCHEM")

JDBC_GET_COLUMNS = (
    "SELECT * FROM (SELECT n.nspname,c.relname,a.attname,a.atttypid,a.attnotnull "
    "OR (t.typtype = 'd' AND t.typnotnull) AS attnotnull,a.atttypmod,a.attlen,t.typtypmod,"
    "row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum) AS attnum, "
    "nullif(a.attidentity, '') as attidentity,"
    "pg_catalog.pg_get_expr(def.adbin, def.adrelid) AS adsrc,dsc.description,t.typbasetype,"
    "t.typtype  FROM pg_catalog.pg_namespace n "
    " JOIN pg_catalog.pg_class c ON (c.relnamespace = n.oid) "
    " JOIN pg_catalog.pg_attribute a ON (a.attrelid=c.oid) "
    " JOIN pg_catalog.pg_type t ON (a.atttypid = t.oid) "
    " LEFT JOIN pg_catalog.pg_attrdef def ON (a.attrelid=def.adrelid AND a.attnum = def.adnum) "
    " LEFT JOIN pg_catalog.pg_description dsc ON (c.oid=dsc.objoid AND a.attnum = dsc.objsubid) "
    " LEFT JOIN pg_catalog.pg_class dc ON (dc.oid=dsc.classoid AND dc.relname='pg_class') "
    " LEFT JOIN pg_catalog.pg_namespace dn ON (dc.relnamespace=dn.oid AND "
    "dn.nspname='pg_catalog') "
    " WHERE c.relkind in ('r','p','v','f','m') and a.attnum > 0 AND NOT a.attisdropped "
    " AND n.nspname LIKE 'public' AND c.relname LIKE 'adult') c WHERE true "
    " AND attname LIKE '%' ORDER BY nspname,c.relname,attnum ")

JDBC_GET_PRIMARY_KEYS = (
    "SELECT        result.TABLE_CAT,        result.TABLE_SCHEM,        result.TABLE_NAME, "
    "       result.COLUMN_NAME,        result.KEY_SEQ,        result.PK_NAME FROM      "
    "(SELECT NULL AS TABLE_CAT, n.nspname AS TABLE_SCHEM,   ct.relname AS TABLE_NAME, "
    "a.attname AS COLUMN_NAME,   (information_schema._pg_expandarray(i.indkey)).n AS KEY_SEQ, "
    "ci.relname AS PK_NAME,   information_schema._pg_expandarray(i.indkey) AS KEYS, "
    "a.attnum AS A_ATTNUM FROM pg_catalog.pg_class ct "
    "  JOIN pg_catalog.pg_attribute a ON (ct.oid = a.attrelid) "
    "  JOIN pg_catalog.pg_namespace n ON (ct.relnamespace = n.oid) "
    "  JOIN pg_catalog.pg_index i ON ( a.attrelid = i.indrelid) "
    "  JOIN pg_catalog.pg_class ci ON (ci.oid = i.indexrelid) "
    "WHERE true  AND n.nspname = E'public' AND ct.relname = E'adult' AND i.indisprimary  ) "
    "result where  result.A_ATTNUM = (result.KEYS).x  "
    "ORDER BY result.table_name, result.pk_name, result.key_seq")

JDBC_GET_IMPORTED_KEYS = (
    "SELECT NULL::text AS PKTABLE_CAT, pkn.nspname AS PKTABLE_SCHEM, pkc.relname AS "
    "PKTABLE_NAME, pka.attname AS PKCOLUMN_NAME, NULL::text AS FKTABLE_CAT, fkn.nspname AS "
    "FKTABLE_SCHEM, fkc.relname AS FKTABLE_NAME, fka.attname AS FKCOLUMN_NAME, pos.n AS KEY_SEQ, "
    "CASE con.confupdtype  WHEN 'c' THEN 0 WHEN 'n' THEN 2 WHEN 'd' THEN 4 WHEN 'r' THEN 1 "
    "WHEN 'p' THEN 1 WHEN 'a' THEN 3 ELSE NULL END AS UPDATE_RULE, "
    "CASE con.confdeltype  WHEN 'c' THEN 0 WHEN 'n' THEN 2 WHEN 'd' THEN 4 WHEN 'r' THEN 1 "
    "WHEN 'p' THEN 1 WHEN 'a' THEN 3 ELSE NULL END AS DELETE_RULE, con.conname AS FK_NAME, "
    "pkic.relname AS PK_NAME, CASE  WHEN con.condeferrable AND con.condeferred THEN 5 "
    " WHEN con.condeferrable THEN 6 ELSE 7 END AS DEFERRABILITY  FROM  pg_catalog.pg_namespace "
    "pkn, pg_catalog.pg_class pkc, pg_catalog.pg_attribute pka,  pg_catalog.pg_namespace fkn, "
    "pg_catalog.pg_class fkc, pg_catalog.pg_attribute fka,  pg_catalog.pg_constraint con,  "
    "pg_catalog.generate_series(1, 32) pos(n),  pg_catalog.pg_class pkic WHERE pkn.oid = "
    "pkc.relnamespace AND pkc.oid = pka.attrelid AND pka.attnum = con.confkey[pos.n] AND "
    "con.confrelid = pkc.oid  AND fkn.oid = fkc.relnamespace AND fkc.oid = fka.attrelid AND "
    "fka.attnum = con.conkey[pos.n] AND con.conrelid = fkc.oid  AND con.contype = 'f' AND "
    "(pkic.relkind = 'i' OR pkic.relkind = 'I') AND pkic.oid = con.conindid  AND fkn.nspname "
    "= E'public' AND fkc.relname = E'adult' ORDER BY pkn.nspname,pkc.relname, con.conname,"
    "pos.n")

JDBC_TYPE_INFO = (
    "SELECT t.typname,t.oid FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON "
    "(t.typnamespace = n.oid)  WHERE n.nspname  != 'pg_toast' AND  (t.typrelid = 0 OR "
    "(SELECT c.relkind = 'c' FROM pg_catalog.pg_class c WHERE c.oid = t.typrelid))")

JDBC_TYPE_CACHE_SQL_TYPE = (
    "SELECT typinput='pg_catalog.array_in'::regproc as is_array, typtype, typname, pg_type.oid "
    "  FROM pg_catalog.pg_type   LEFT JOIN (select ns.oid as nspoid, ns.nspname, r.r "
    "          from pg_namespace as ns "
    "          join ( select s.r, (current_schemas(false))[s.r] as nspname "
    "                   from generate_series(1, array_upper(current_schemas(false), 1)) as s(r) )"
    " as r          using ( nspname )        ) as sp     ON sp.nspoid = typnamespace "
    " WHERE pg_type.oid = $1  ORDER BY sp.r, pg_type.oid DESC")

JDBC_TYPE_CACHE_PG_TYPE = (
    "SELECT n.nspname = ANY(current_schemas(true)), n.nspname, t.typname FROM "
    "pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON t.typnamespace = n.oid "
    "WHERE t.oid = $1")

JDBC: list[tuple[str, str, tuple[object, ...]]] = [
    ("set_extra_float_digits", "SET extra_float_digits = 3", ()),
    ("set_application_name", "SET application_name = 'PostgreSQL JDBC Driver'", ()),
    ("getTables", JDBC_GET_TABLES, ()),
    ("getSchemas", JDBC_GET_SCHEMAS, ()),
    ("getColumns", JDBC_GET_COLUMNS, ()),
    ("getPrimaryKeys", JDBC_GET_PRIMARY_KEYS, ()),
    ("getImportedKeys", JDBC_GET_IMPORTED_KEYS, ()),
    ("getTypeInfo", JDBC_TYPE_INFO, ()),
    ("TypeInfoCache.getSQLType", JDBC_TYPE_CACHE_SQL_TYPE, (1007,)),
    ("TypeInfoCache.getPGType", JDBC_TYPE_CACHE_PG_TYPE, (20,)),
]

DBEAVER: list[tuple[str, str, tuple[object, ...]]] = [
    ("search_path_setting", "SELECT reset_val FROM pg_settings WHERE name = 'search_path'", ()),
    ("default_objects", "SELECT current_database(), current_schema(),session_user", ()),
    ("show_search_path", "SHOW search_path", ()),
    ("database", "SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname=$1",
     ("adult",)),
    ("schemas", "SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n\n"
     "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0 AND "
     "d.classoid='pg_namespace'::regclass\n ORDER BY nspname", ()),
    ("tables", "SELECT c.oid,c.*,d.description,pg_catalog.pg_get_expr(c.relpartbound, c.oid) "
     "as partition_expr,  pg_catalog.pg_get_partkeydef(c.oid) as partition_key \n"
     "FROM pg_catalog.pg_class c\nLEFT OUTER JOIN pg_catalog.pg_description d ON "
     "d.objoid=c.oid AND d.objsubid=0 AND d.classoid='pg_class'::regclass\n"
     "WHERE c.relnamespace=$1 AND c.relkind not in ('i','I','c')", (2200,)),
    ("tables_with_parents", "SELECT c.oid,c.*,d.description,(select array_agg(i.inhparent) "
     "from pg_catalog.pg_inherits i where i.inhrelid = c.oid) parents\nFROM pg_catalog.pg_class c"
     "\nLEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0\n"
     "WHERE c.relnamespace=$1 AND c.relkind not in ('i','c')", (16385,)),
    ("columns", "SELECT c.relname,a.*,pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) as "
     "def_value,dsc.description,dep.objid\nFROM pg_catalog.pg_attribute a\n"
     "INNER JOIN pg_catalog.pg_class c ON (a.attrelid=c.oid)\n"
     "LEFT OUTER JOIN pg_catalog.pg_attrdef ad ON (a.attrelid=ad.adrelid AND a.attnum = "
     "ad.adnum)\nLEFT OUTER JOIN pg_catalog.pg_description dsc ON (c.oid=dsc.objoid AND "
     "a.attnum = dsc.objsubid)\nLEFT OUTER JOIN pg_depend dep on dep.refobjid = a.attrelid AND "
     "dep.deptype = 'i' and dep.refobjsubid = a.attnum and dep.classid = dep.refclassid\n"
     "WHERE NOT a.attisdropped AND c.relkind not in ('i','I','c') AND c.relnamespace=$1 "
     "ORDER BY a.attnum", (2200,)),
    ("type", "SELECT t.oid,t.*,c.relkind,format_type(nullif(t.typbasetype, 0), t.typtypmod) as "
     "base_type_name FROM pg_catalog.pg_type t\nLEFT OUTER JOIN pg_class c ON c.oid=t.typrelid\n"
     "LEFT OUTER JOIN pg_catalog.pg_description d ON t.oid=d.objoid\nWHERE t.oid=$1 ", (25,)),
    ("all_types", "SELECT t.oid,t.*,c.relkind,format_type(nullif(t.typbasetype, 0), "
     "t.typtypmod) as base_type_name, d.description\nFROM pg_catalog.pg_type t\n"
     "LEFT OUTER JOIN pg_catalog.pg_type et ON et.oid=t.typelem\n"
     "LEFT OUTER JOIN pg_catalog.pg_class c ON c.oid=t.typrelid\n"
     "LEFT OUTER JOIN pg_catalog.pg_description d ON t.oid=d.objoid\n"
     "WHERE t.typname IS NOT NULL AND (c.relkind IS NULL OR c.relkind = 'c') AND "
     "(et.typcategory IS NULL OR et.typcategory <> 'C')", ()),
    ("constraints", "SELECT c.oid,c.*,t.relname as tabrelname,rt.relnamespace as refnamespace"
     "\nFROM pg_catalog.pg_constraint c\nINNER JOIN pg_catalog.pg_class t ON t.oid=c.conrelid"
     "\nLEFT OUTER JOIN pg_catalog.pg_class rt ON rt.oid=c.confrelid\nWHERE t.relnamespace=$1"
     "\nORDER BY c.oid", (2200,)),
    ("indexes", "SELECT i.*,i.indkey as keys,c.relname,c.relnamespace,c.relam,tc.relname as "
     "tabrelname,dsc.description,pg_catalog.pg_get_expr(i.indexprs, i.indrelid, true) as expr"
     "\nFROM pg_catalog.pg_index i\nINNER JOIN pg_catalog.pg_class c ON c.oid=i.indexrelid\n"
     "INNER JOIN pg_catalog.pg_class tc ON tc.oid=i.indrelid\n"
     "LEFT OUTER JOIN pg_catalog.pg_description dsc ON i.indexrelid=dsc.objoid\n"
     "WHERE  c.relnamespace=$1 ORDER BY c.relname", (2200,)),
    ("procedures", "SELECT p.oid,p.*,d.description\nFROM pg_catalog.pg_proc p\n"
     "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=p.oid\n"
     "WHERE p.pronamespace=$1\nORDER BY p.proname", (2200,)),
    ("collations", "SELECT c.oid,c.* FROM pg_catalog.pg_collation c \nWHERE c.collnamespace=$1"
     "\nORDER BY c.oid", (11,)),
    ("extensions", "SELECT e.oid,e.* FROM pg_catalog.pg_extension e \nWHERE e.extnamespace=$1"
     "\nORDER BY e.oid", (2200,)),
    ("roles", "SELECT a.oid,a.* FROM pg_catalog.pg_roles a ORDER BY a.oid", ()),
    ("keywords", "select string_agg(word, ',') from pg_catalog.pg_get_keywords() where word <> "
     "ALL ('{a,abs,absolute,select,table}'::text[])", ()),
    ("array_type_probe", JDBC_TYPE_CACHE_SQL_TYPE.replace("$1", "1007"), ()),
]
