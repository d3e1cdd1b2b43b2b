-- a column of a table not in FROM
-- expect: unknown table
SELECT COUNT(*) FROM adult WHERE other.age > 30
