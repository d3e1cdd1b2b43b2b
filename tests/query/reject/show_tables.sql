-- list the store's tables
-- expect: SHOW
SHOW TABLES
