-- a table macro in a LATERAL join reads a sensitive table by name
-- expect: histogram_values
SELECT * FROM released.adult_syn CROSS JOIN LATERAL histogram_values(adult, age)
