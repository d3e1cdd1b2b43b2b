-- PERCENTILE_CONT ordered descending
-- expect: one ascending ORDER BY
SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age DESC) FROM adult
