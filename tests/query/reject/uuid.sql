-- a random identifier
-- expect: not deterministic
SELECT COUNT(*) FROM adult WHERE uuid() IS NOT NULL
