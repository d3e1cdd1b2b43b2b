-- PIVOT
-- expect: PIVOT
PIVOT adult ON sex USING count(*)
