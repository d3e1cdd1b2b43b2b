-- change a sensitive table
-- expect: ALTER
ALTER TABLE adult ADD COLUMN x INTEGER
