-- a table function joined in
-- expect: JOIN
SELECT COUNT(*) FROM adult, unnest([1, 2])
