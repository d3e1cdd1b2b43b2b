-- a quantile
-- expect: has no differentially private mechanism
SELECT quantile_cont(age, 0.9) FROM adult
