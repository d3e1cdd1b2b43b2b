-- add rows to a sensitive table
-- expect: INSERT
INSERT INTO adult SELECT * FROM adult
