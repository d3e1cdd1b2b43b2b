-- a column with no value list grouped with another key: only one selected key a query
-- expect: with other keys
SELECT indp, sex, COUNT(*) FROM acs GROUP BY indp, sex
