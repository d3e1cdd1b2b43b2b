-- COUNT(DISTINCT) in WHERE
-- expect: in row conditions
SELECT COUNT(*) FROM adult WHERE COUNT(DISTINCT age) > 3
