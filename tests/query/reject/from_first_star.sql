-- raw rows in DuckDB's FROM-first form
-- expect: SELECT *
FROM adult LIMIT 5
