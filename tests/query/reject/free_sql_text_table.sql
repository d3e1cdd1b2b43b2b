-- a FROM-less query that hides a sensitive table inside SQL text
-- expect: subqueries are not allowed
SELECT (SELECT count(*) FROM query_table('adult'))
