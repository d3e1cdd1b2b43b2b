-- pick a raw value
-- expect: has no differentially private mechanism
SELECT first(age) FROM adult
