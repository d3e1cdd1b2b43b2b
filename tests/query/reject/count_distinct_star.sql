-- COUNT(DISTINCT *) would compare whole rows
-- expect: raw rows
SELECT COUNT(DISTINCT *) FROM adult
