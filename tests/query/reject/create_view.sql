-- a view over raw rows
-- expect: CREATE
CREATE VIEW v AS SELECT * FROM adult
