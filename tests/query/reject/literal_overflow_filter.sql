-- literal overflow inside FILTER
-- expect: outside the BIGINT range
-- at: 4:37
SELECT COUNT(*) FILTER (WHERE age < 9223372036854775807 * 2) FROM adult
