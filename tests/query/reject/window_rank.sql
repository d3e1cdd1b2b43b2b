-- a window over groups
-- expect: window
SELECT race, rank() OVER (ORDER BY COUNT(*)) FROM adult GROUP BY race
