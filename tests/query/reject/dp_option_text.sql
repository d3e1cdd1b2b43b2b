-- a non-numeric epsilon
-- expect: needs a number
SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 'a lot') COUNT(*) FROM adult
