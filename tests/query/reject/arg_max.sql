-- the row with the largest value
-- expect: has no differentially private mechanism
SELECT arg_max(age, capital_gain) FROM adult
