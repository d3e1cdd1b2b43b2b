-- run arbitrary SQL through query()
-- expect: query
SELECT * FROM query('SELECT * FROM adult')
