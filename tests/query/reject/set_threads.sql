-- change a database setting
-- expect: SET threads
SET threads = 1
