-- two queries for the price of one check
-- expect: several statements
SELECT COUNT(*) FROM adult; SELECT COUNT(*) FROM adult
