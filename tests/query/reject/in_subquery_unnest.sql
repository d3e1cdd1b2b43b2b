-- IN over UNNEST
-- expect: subquer
SELECT COUNT(*) FROM adult WHERE age IN (SELECT unnest([1, 2]))
