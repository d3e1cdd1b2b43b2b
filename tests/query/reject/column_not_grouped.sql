-- a second column not in GROUP BY
-- expect: outside an aggregate
SELECT race, sex, COUNT(*) FROM adult GROUP BY race
