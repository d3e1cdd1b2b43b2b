-- group by an expression with no public key set
-- expect: no public key set
SELECT age + 1, COUNT(*) FROM adult GROUP BY age + 1
