-- the quantile read from a column (data-dependent)
-- expect: must be a number written in the query
SELECT QUANTILE_CONT(age, hours_per_week) FROM adult
