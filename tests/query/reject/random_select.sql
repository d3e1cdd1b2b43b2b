-- random() in the output
-- expect: not deterministic
SELECT COUNT(*) + random() FROM adult
