-- MEDIAN
-- expect: MEDIAN has no
SELECT MEDIAN(age) FROM adult
