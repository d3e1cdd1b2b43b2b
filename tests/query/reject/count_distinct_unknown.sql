-- COUNT(DISTINCT) of a column the dataset lacks
-- expect: unknown column
SELECT COUNT(DISTINCT zip) FROM adult
