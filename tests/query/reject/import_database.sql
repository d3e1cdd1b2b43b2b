-- import a database
-- expect: IMPORT
IMPORT DATABASE '/tmp/dump'
