-- a quantile outside [0, 1]
-- expect: outside [0, 1]
SELECT QUANTILE_CONT(age, 1.5) FROM adult
