-- literal overflow in HAVING
-- expect: outside the BIGINT range
-- at: 4:46
SELECT COUNT(*) FROM adult HAVING COUNT(*) > 9223372036854775807 + 1
