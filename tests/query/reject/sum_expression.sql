-- aggregate an expression with no declared bounds
-- expect: over an expression
SELECT SUM(age * 1000000) FROM adult
