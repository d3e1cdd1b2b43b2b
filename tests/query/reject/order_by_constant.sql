-- ORDER BY a literal (DuckDB refuses it too)
-- expect: ORDER BY a constant
SELECT race, COUNT(*) FROM adult GROUP BY race ORDER BY NULL
