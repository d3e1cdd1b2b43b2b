-- order by a hidden column
-- expect: hidden
SELECT COUNT(*) FROM adult ORDER BY fnlwgt
