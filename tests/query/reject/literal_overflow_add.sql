-- integer literal arithmetic that overflows BIGINT: DuckDB raised it only on rows reaching it
-- expect: outside the BIGINT range
-- at: 4:53
SELECT COUNT(*) FROM adult WHERE age > 30 AND age < 9223372036854775807 + 1
