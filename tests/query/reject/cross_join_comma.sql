-- a comma join
-- expect: JOIN
-- at: 4:29
SELECT COUNT(*) FROM adult, adult AS b
