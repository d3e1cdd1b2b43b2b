-- a negative quantile is an expression, not a literal
-- expect: must be a number written in the query
SELECT QUANTILE_CONT(age, -0.5) FROM adult
