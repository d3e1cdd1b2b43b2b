-- PERCENTILE_CONT ordered by two columns
-- expect: one ascending ORDER BY
SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age, sex) FROM adult
