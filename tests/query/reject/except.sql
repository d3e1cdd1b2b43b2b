-- EXCEPT
-- expect: EXCEPT
SELECT race FROM adult EXCEPT SELECT race FROM adult WHERE age > 3
