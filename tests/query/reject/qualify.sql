-- QUALIFY
-- expect: window
SELECT race, COUNT(*) FROM adult GROUP BY race QUALIFY row_number() OVER () = 1
