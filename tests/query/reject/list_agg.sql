-- collect raw values
-- expect: has no differentially private mechanism
SELECT list(age) FROM adult
