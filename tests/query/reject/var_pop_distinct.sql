-- a variance of the distinct values (no bounded sensitivity)
-- expect: VAR_POP(DISTINCT ...) is not supported
SELECT VAR_POP(DISTINCT age) FROM adult
