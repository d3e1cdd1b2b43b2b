-- reseed the generator
-- expect: not deterministic
SELECT COUNT(*) FROM adult WHERE setseed(0.5) IS NULL
