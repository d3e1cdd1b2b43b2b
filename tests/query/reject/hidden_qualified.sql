-- a hidden column behind a table alias
-- expect: hidden
SELECT COUNT(*) FROM adult AS a WHERE a.fnlwgt > 100
