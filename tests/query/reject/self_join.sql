-- a self-join multiplies a unit's rows
-- expect: JOIN
-- at: 4:35
SELECT COUNT(*) FROM adult a JOIN adult b ON a.age = b.age
