-- a string left open after a comment holding a quote
-- expect: a string never closed
-- at: 5:13
SELECT COUNT(*) FROM adult -- it's fine here
WHERE sex = '1
