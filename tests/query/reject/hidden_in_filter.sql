-- a hidden column in FILTER
-- expect: hidden
SELECT COUNT(*) FILTER (WHERE fnlwgt > 3) FROM adult
