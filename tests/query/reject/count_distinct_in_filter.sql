-- COUNT(DISTINCT) inside an aggregate's FILTER
-- expect: in row conditions
SELECT COUNT(*) FILTER (WHERE COUNT(DISTINCT age) > 3) FROM adult
