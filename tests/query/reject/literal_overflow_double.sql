-- literal arithmetic beyond DOUBLE
-- expect: outside the DOUBLE range
-- at: 4:40
SELECT COUNT(*) FROM adult WHERE age < 1e308 * 10
