-- exfiltrate a table to a file
-- expect: COPY
COPY adult TO '/tmp/adult.csv' (HEADER)
