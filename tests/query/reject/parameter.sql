-- a bind parameter
-- expect: parameter
SELECT COUNT(*) FROM adult WHERE age > ?
