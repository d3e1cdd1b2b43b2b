-- a private column outside an aggregate
-- expect: outside an aggregate
SELECT age FROM adult
