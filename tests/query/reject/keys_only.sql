-- GROUP BY keys with no aggregate
-- expect: at least one aggregate
SELECT race FROM adult GROUP BY race
