-- ROLLUP
-- expect: ROLLUP
SELECT race, sex, COUNT(*) FROM adult GROUP BY ROLLUP (race, sex)
