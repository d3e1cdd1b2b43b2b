-- LIKE casts numbers to text
-- expect: mixes
SELECT COUNT(*) FROM adult WHERE age LIKE '1%'
