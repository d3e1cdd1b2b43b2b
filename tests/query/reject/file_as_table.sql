-- read a file named as a table
-- expect: unknown dataset
SELECT COUNT(*) FROM '/etc/passwd'
