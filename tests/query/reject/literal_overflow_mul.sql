-- a product of literals beyond BIGINT
-- expect: outside the BIGINT range
-- at: 4:40
SELECT COUNT(*) FROM adult WHERE age < 3037000500 * 3037000500
