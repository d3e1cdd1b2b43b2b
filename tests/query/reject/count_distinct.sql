-- a distinct count has unbounded sensitivity here
-- expect: DISTINCT
SELECT COUNT(DISTINCT age) FROM adult
