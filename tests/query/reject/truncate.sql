-- erase a table
-- expect: TRUNCATE
TRUNCATE adult
