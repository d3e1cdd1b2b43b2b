-- EXISTS
-- expect: subquer
SELECT COUNT(*) FROM adult WHERE EXISTS (SELECT 1 FROM adult WHERE age = 30)
