-- a scalar subquery in SELECT
-- expect: subquer
SELECT (SELECT COUNT(*) FROM adult)
