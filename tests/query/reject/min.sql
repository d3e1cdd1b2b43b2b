-- MIN releases an exact record value
-- expect: MIN has no
SELECT MIN(age) FROM adult
