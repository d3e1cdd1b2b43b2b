-- a standard deviation
-- expect: has no differentially private mechanism
SELECT stddev(hours_per_week) FROM adult
