-- negating BIGINT's minimum
-- expect: outside the BIGINT range
-- at: 4:43
SELECT COUNT(*) FROM adult WHERE age < -(-9223372036854775807 - 1)
