-- MIN of a hidden column
-- expect: hidden
SELECT MIN(fnlwgt) FROM adult
