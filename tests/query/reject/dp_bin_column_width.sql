-- a data-dependent bin width
-- expect: positive number
SELECT dp_bin(age, capital_gain), COUNT(*) FROM adult GROUP BY 1
