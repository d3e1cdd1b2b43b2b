-- ILIKE lowercases pattern and escape, so a letter escape could end the pattern on some rows
-- expect: ESCAPE takes one quoted ASCII punctuation character
-- at: 4:34
SELECT COUNT(*) FROM adult WHERE sex ILIKE 'aq' ESCAPE 'Q'
