-- DuckDB's count_star() is not on the allowlist
-- expect: count_star
SELECT count_star() FROM adult
