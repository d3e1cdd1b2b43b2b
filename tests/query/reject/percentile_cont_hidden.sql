-- PERCENTILE_CONT of a hidden column
-- expect: hidden
SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY fnlwgt) FROM adult
