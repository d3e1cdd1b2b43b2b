-- INTERSECT
-- expect: INTERSECT
-- at: 4:24
SELECT race FROM adult INTERSECT SELECT race FROM adult
