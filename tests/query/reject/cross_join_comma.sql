-- a comma join
-- expect: JOIN
SELECT COUNT(*) FROM adult, adult AS b
