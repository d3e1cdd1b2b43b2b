-- QUANTILE_DISC has no mechanism
-- expect: has no differentially private mechanism
SELECT quantile_disc(age, 0.9) FROM adult
