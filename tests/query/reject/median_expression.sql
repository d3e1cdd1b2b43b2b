-- the median of an expression the planner cannot bound
-- expect: over an expression
SELECT MEDIAN(age * 1000) FROM adult
