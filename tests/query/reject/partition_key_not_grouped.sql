-- a column with no value list used outside GROUP BY
-- expect: not a GROUP BY key
SELECT indp, COUNT(*) FROM acs
