-- a table macro in a LATERAL join that takes a sensitive table by name
-- expect: LATERAL function histogram is not allowed
SELECT * FROM released.adult_syn CROSS JOIN LATERAL histogram(adult, age)
