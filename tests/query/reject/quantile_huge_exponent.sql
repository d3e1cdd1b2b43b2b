-- a quantile literal whose exact value would take gigabytes
-- expect: more than 6 decimals
SELECT QUANTILE_CONT(age, 1e-999999999) FROM adult
