-- a quantile in WHERE
-- expect: in row conditions
SELECT COUNT(*) FROM adult WHERE age > MEDIAN(age)
