-- read a file through a table function
-- expect: read_csv
SELECT COUNT(*) FROM read_csv('/etc/passwd')
