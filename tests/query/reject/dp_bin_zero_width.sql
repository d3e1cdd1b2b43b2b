-- a zero bin width
-- expect: positive number
SELECT dp_bin(age, 0), COUNT(*) FROM adult GROUP BY 1
