-- a LIKE pattern ending in its escape character
-- expect: escape character
SELECT COUNT(*) FROM acs WHERE puma LIKE 'ab!' ESCAPE '!'
