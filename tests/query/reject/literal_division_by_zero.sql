-- a division of literals by zero
-- expect: divides by zero
-- at: 4:40
SELECT COUNT(*) FROM adult WHERE age < 1 / (3 - 3)
