-- a discrete percentile has no mechanism
-- expect: QUANTILE_DISC has no differentially private mechanism
SELECT PERCENTILE_DISC(0.5) WITHIN GROUP (ORDER BY age) FROM adult
