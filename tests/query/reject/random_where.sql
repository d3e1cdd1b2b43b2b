-- a random filter
-- expect: not deterministic
SELECT COUNT(*) FROM adult WHERE random() < 0.5
