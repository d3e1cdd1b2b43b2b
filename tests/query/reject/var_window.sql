-- a variance as a window function
-- expect: window functions are not allowed
SELECT VAR_POP(age) OVER (PARTITION BY sex) FROM adult
