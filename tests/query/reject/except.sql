-- EXCEPT
-- expect: EXCEPT
-- at: 4:24
SELECT race FROM adult EXCEPT SELECT race FROM adult WHERE age > 3
