-- CASE builds an unbounded value
-- expect: over an expression
SELECT SUM(CASE WHEN sex = 1 THEN capital_gain ELSE 0 END) FROM adult
