-- COUNT(DISTINCT a, b): pairs of values
-- expect: takes one column
SELECT COUNT(DISTINCT age, sex) FROM adult
