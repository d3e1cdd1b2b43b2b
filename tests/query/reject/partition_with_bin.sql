-- a selected key mixed with a public bin
-- expect: with other keys
SELECT COUNT(*) FROM acs GROUP BY dp_bin(agep, 10), indp
