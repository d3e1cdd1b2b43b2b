-- SUM of a text column
-- expect: no bounds
SELECT SUM(puma) FROM acs
