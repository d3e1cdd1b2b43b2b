-- a subquery in WHERE
-- expect: subquer
SELECT COUNT(*) FROM adult WHERE age IN (SELECT age FROM adult WHERE sex = 1)
