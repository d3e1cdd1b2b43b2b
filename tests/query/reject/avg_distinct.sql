-- AVG(DISTINCT): distinct values have no bounded sensitivity
-- expect: DISTINCT
SELECT AVG(DISTINCT age) FROM adult
