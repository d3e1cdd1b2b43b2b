-- raw rows minus a column
-- expect: SELECT *
SELECT * EXCLUDE (fnlwgt) FROM adult
