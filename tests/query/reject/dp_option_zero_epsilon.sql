-- a zero epsilon is no privacy cost at all
-- expect: option epsilon must be greater than 0
-- at: 4:43
SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0) COUNT(*) FROM adult
