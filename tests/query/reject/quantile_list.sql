-- several quantiles in one call
-- expect: must be a number written in the query
SELECT QUANTILE_CONT(age, [0.1, 0.9]) FROM adult
