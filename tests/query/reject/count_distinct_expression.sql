-- COUNT(DISTINCT) of an expression (its values are not a column's)
-- expect: over an expression
SELECT COUNT(DISTINCT age + 1) FROM adult
