-- a regular expression function
-- expect: regexp
SELECT COUNT(*) FROM acs WHERE regexp_matches(puma, '0+')
