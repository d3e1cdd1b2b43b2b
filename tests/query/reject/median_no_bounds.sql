-- the median of a text column without bounds
-- expect: no bounds
SELECT MEDIAN(puma) FROM acs
