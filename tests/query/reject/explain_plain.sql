-- read plans with cardinality estimates
-- expect: EXPLAIN
EXPLAIN SELECT * FROM adult WHERE age = 30
