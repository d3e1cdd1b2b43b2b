-- group by a hidden column
-- expect: hidden
SELECT fnlwgt, COUNT(*) FROM adult GROUP BY fnlwgt
