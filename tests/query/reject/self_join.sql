-- a self-join multiplies a unit's rows
-- expect: JOIN
SELECT COUNT(*) FROM adult a JOIN adult b ON a.age = b.age
