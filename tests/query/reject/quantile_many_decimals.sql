-- a quantile too finely written for exact integer scores
-- expect: more than 6 decimals
SELECT QUANTILE_CONT(age, 0.1234567) FROM adult
