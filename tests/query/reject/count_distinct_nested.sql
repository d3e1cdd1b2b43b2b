-- a distinct count of an aggregate
-- expect: over an expression
SELECT COUNT(DISTINCT SUM(age)) FROM adult
