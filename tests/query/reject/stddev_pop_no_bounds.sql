-- a standard deviation of a text column (no bounds)
-- expect: has no bounds
SELECT STDDEV_POP(puma) FROM acs
