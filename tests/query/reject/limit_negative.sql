-- a negative LIMIT
-- expect: LIMIT cannot be negative
SELECT sex, COUNT(*) FROM adult GROUP BY sex LIMIT -1
