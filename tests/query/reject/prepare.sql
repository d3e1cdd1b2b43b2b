-- a prepared raw query
-- expect: PREPARE
PREPARE q AS SELECT * FROM adult
