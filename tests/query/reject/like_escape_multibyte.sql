-- a multi-byte ESCAPE character: DuckDB raised it only on rows reaching the LIKE
-- expect: ASCII
-- at: 4:34
SELECT COUNT(*) FROM adult WHERE sex LIKE 'F%' ESCAPE 'é'
