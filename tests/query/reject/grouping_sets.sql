-- several groupings at once
-- expect: GROUPING SETS
SELECT race, COUNT(*) FROM adult GROUP BY GROUPING SETS ((race), ())
