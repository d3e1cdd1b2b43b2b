-- a join on a column that is not the public table's unique key fans rows out
-- expect: is not the key of edu
-- at: 4:52
SELECT COUNT(*) FROM adult a JOIN edu e ON a.age = e.years
