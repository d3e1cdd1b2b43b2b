-- group by an aggregate
-- expect: GROUP BY an aggregate
SELECT COUNT(*) FROM adult GROUP BY COUNT(*)
