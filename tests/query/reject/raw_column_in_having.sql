-- a private column in HAVING
-- expect: outside an aggregate
SELECT COUNT(*) FROM adult GROUP BY dp_bin(age, 10) HAVING capital_gain > 3
