-- a private column in ORDER BY
-- expect: outside an aggregate
SELECT race, COUNT(*) FROM adult GROUP BY race ORDER BY age
