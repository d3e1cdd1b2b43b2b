-- a literal DuckDB cannot read
-- expect: out of range
SELECT COUNT(*) FROM adult WHERE age > 1e999
