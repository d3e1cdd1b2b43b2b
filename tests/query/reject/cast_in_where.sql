-- a cast that could fail on some row
-- expect: CAST
SELECT COUNT(*) FROM adult WHERE CAST(age AS VARCHAR) = '3'
