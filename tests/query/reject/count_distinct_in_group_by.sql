-- GROUP BY a distinct count
-- expect: GROUP BY an aggregate
SELECT COUNT(*) FROM adult GROUP BY COUNT(DISTINCT age)
