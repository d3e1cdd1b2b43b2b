-- age has bins of 10, not single values
-- expect: no public list of values
SELECT age, COUNT(*) FROM adult GROUP BY age
