-- raw rows
-- expect: SELECT *
SELECT * FROM adult
