-- sum a hidden column
-- expect: hidden
SELECT SUM(fnlwgt) FROM adult
