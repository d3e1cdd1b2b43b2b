-- a common table expression
-- expect: WITH
WITH a AS (SELECT * FROM adult) SELECT COUNT(*) FROM a
