-- GROUP BY a spread aggregate
-- expect: cannot GROUP BY an aggregate
SELECT COUNT(*) FROM adult GROUP BY STDDEV_POP(age)
