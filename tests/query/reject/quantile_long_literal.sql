-- a quantile literal longer than Decimal's 28 digits (normalize() would round it to 0.1)
-- expect: more than 6 decimals
SELECT QUANTILE_CONT(age, 0.1000000000000000000000000000001) FROM adult
