-- HAVING without an aggregate or key still needs a true/false condition
-- expect: needs a true/false condition
SELECT COUNT(*) FROM adult HAVING 5
