-- describe a sensitive table
-- expect: DESCRIBE
DESCRIBE adult
