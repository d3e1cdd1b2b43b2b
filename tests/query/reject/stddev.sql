-- a spread over an expression (bounds are declared per column)
-- expect: STDDEV_SAMP over an expression is not supported
SELECT stddev(hours_per_week * 2) FROM adult
