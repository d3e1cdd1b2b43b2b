-- copy raw rows into a new table
-- expect: CREATE
CREATE TABLE stolen AS SELECT * FROM adult
