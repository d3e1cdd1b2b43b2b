-- filter on a hidden column
-- expect: hidden
SELECT COUNT(*) FROM adult WHERE fnlwgt > 100
