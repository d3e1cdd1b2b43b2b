-- smuggle a second statement
-- expect: several statements
SELECT COUNT(*) FROM adult; DROP TABLE adult
