-- UNION
-- expect: UNION
-- at: 4:28
SELECT COUNT(*) FROM adult UNION SELECT COUNT(*) FROM adult
