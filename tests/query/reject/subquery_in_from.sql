-- a subquery in FROM
-- expect: subquer
SELECT COUNT(*) FROM (SELECT * FROM adult WHERE age > 30)
