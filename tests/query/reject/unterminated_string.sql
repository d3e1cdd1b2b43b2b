-- unreadable SQL
-- expect: cannot read
SELECT COUNT(*) FROM adult WHERE race = 'abc
