-- DISTINCT lists the values present
-- expect: DISTINCT
SELECT DISTINCT race FROM adult
