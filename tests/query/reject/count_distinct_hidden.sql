-- COUNT(DISTINCT) of a hidden column
-- expect: hidden
SELECT COUNT(DISTINCT fnlwgt) FROM adult
