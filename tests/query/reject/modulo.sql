-- modulo is not on the allowlist
-- expect: MOD
SELECT COUNT(*) FROM adult WHERE age % 2 = 0
