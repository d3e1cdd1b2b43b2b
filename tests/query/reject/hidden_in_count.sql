-- count a hidden column
-- expect: hidden
SELECT COUNT(fnlwgt) FROM adult
