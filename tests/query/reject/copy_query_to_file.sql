-- exfiltrate a query result
-- expect: COPY
COPY (SELECT * FROM adult) TO '/tmp/x.parquet'
