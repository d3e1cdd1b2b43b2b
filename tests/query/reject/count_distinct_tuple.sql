-- COUNT(DISTINCT) of a row value
-- expect: over an expression
SELECT COUNT(DISTINCT (age, sex)) FROM adult
