-- a fractional width on an integer column
-- expect: integer width
SELECT dp_bin(age, 2.5), COUNT(*) FROM adult GROUP BY 1
