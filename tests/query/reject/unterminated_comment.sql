-- a block comment left open
-- expect: a comment never closed
-- at: 4:28
SELECT COUNT(*) FROM adult /* WHERE sex = 1
