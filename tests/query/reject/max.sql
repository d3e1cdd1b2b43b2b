-- MAX releases an exact record value
-- expect: MAX has no
SELECT MAX(capital_gain) FROM adult WHERE sex = 1
