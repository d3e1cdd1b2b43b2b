-- a window aggregate returns one value per row
-- expect: window
SELECT COUNT(*) OVER () FROM adult
