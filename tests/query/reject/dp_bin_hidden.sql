-- bin a hidden column
-- expect: hidden
SELECT dp_bin(fnlwgt, 10), COUNT(*) FROM adult GROUP BY 1
