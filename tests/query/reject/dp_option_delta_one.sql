-- a delta of 1 promises nothing
-- expect: option delta must be at least 0 and below 1
SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, delta = 1) COUNT(*) FROM adult
