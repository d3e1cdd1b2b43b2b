-- read the catalog
-- expect: duckdb_tables
SELECT * FROM duckdb_tables()
