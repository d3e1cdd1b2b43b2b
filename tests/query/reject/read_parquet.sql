-- read a file through a table function
-- expect: read_parquet
SELECT COUNT(*) FROM read_parquet('/tmp/x.parquet')
