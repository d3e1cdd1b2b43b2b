-- abs() of BIGINT's minimum overflows
-- expect: outside the BIGINT range
-- at: 4:40
SELECT COUNT(*) FROM adult WHERE age > abs(-9223372036854775807 - 1)
