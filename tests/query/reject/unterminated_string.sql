-- unreadable SQL
-- expect: cannot read this SQL (a string never closed)
-- at: 4:41
SELECT COUNT(*) FROM adult WHERE race = 'abc
