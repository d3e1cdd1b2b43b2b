-- open another database
-- expect: ATTACH
ATTACH '/tmp/other.duckdb' AS other
