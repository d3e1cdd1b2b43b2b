-- the quantile as text
-- expect: must be a number written in the query
SELECT QUANTILE_CONT(age, '0.5') FROM adult
