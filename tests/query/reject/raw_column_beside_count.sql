-- a private column next to an aggregate
-- expect: outside an aggregate
SELECT age, COUNT(*) FROM adult
