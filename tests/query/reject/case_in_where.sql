-- CASE in a row condition
-- expect: CASE is not allowed
-- at: 4:34
SELECT COUNT(*) FROM adult WHERE CASE WHEN sex = 1 THEN true END
