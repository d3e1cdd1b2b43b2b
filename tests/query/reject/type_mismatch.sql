-- a comparison that casts a text literal per row
-- expect: mixes number and text values
SELECT COUNT(*) FROM adult WHERE age = 'abc'
