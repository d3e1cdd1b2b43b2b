-- a comparison that casts a text literal per row
-- expect: mixes
SELECT COUNT(*) FROM adult WHERE age = 'abc'
