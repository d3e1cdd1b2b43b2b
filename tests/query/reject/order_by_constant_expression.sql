-- ordering by a constant expression does nothing
-- expect: ORDER BY a constant has no effect
-- at: 4:55
SELECT sex, COUNT(*) FROM adult GROUP BY sex ORDER BY 1 + 1
