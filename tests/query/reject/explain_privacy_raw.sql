-- EXPLAIN PRIVACY of a raw-row query
-- expect: SELECT *
EXPLAIN PRIVACY SELECT * FROM adult
