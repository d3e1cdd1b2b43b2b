-- an aggregate inside WHERE
-- expect: variance
SELECT COUNT(*) FROM adult WHERE VARIANCE(age) > 10
