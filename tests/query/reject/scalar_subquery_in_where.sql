-- a scalar subquery compared per row
-- expect: subquer
SELECT COUNT(*) FROM adult WHERE age > (SELECT AVG(age) FROM adult)
