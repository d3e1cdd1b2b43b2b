-- list attached databases
-- expect: PRAGMA
PRAGMA database_list
