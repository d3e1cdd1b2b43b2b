-- an integer literal BIGINT cannot hold (DuckDB reads it as HUGEINT or BIGNUM)
-- expect: outside the BIGINT range
-- at: 4:40
SELECT COUNT(*) FROM adult WHERE age < 9223372036854775808
