-- a quantile per privately selected key (its noise is per public cell)
-- expect: a quantile by indp
SELECT indp, MEDIAN(agep) FROM acs GROUP BY indp
