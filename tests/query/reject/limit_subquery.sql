-- a subquery in LIMIT
-- expect: subquer
SELECT COUNT(*) FROM adult LIMIT (SELECT 1)
