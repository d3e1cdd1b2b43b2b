-- CUBE
-- expect: CUBE
SELECT race, sex, COUNT(*) FROM adult GROUP BY CUBE (race, sex)
