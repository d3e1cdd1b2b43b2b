-- the clock
-- expect: not deterministic
SELECT COUNT(*) FROM adult WHERE now() IS NOT NULL
